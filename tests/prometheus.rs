//! `deploy/prometheus` and `deploy/grafana` against the real thing: `promtool` checks the
//! rules and runs their unit tests; the cluster's Prometheus (`make up` starts it) scrapes
//! every node and evaluates every rule without error; a malformed record in each region
//! fires `GeostateDeadLetters` there; every query of the Grafana dashboard returns series.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use common::{add, cluster, produce_all, producer, repo_file, unique};
use geostate::pb::state_client::StateClient;
use geostate_jepsen::prometheus::{api, query};
use serde_json::Value;

const PROMTOOL: &str = "/usr/bin/promtool";

fn promtool(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(PROMTOOL)
        .args(args)
        .current_dir(repo_file("deploy/prometheus"))
        .output()
        .context("promtool (Debian's prometheus package, `cluster.py install`)")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(out.status.success(), "promtool {args:?}: {text}");
    Ok(text)
}

#[test]
fn promtool_checks_the_rules_and_runs_their_unit_tests() -> anyhow::Result<()> {
    let checked = promtool(&["check", "rules", "rules.yml"])?;
    println!("{checked}");
    let tested = promtool(&["test", "rules", "rules.test.yml"])?;
    println!("{tested}");
    Ok(())
}

/// Every expression of the dashboard's panels, with its variables as "All" and a 1 m
/// rate interval.
fn dashboard_queries() -> anyhow::Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(repo_file("deploy/grafana/geostate.json"))?;
    let dashboard: Value = serde_json::from_str(&text)?;
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().context("panels")? {
        for target in panel["targets"].as_array().context("targets")? {
            let expr = target["expr"].as_str().context("expr")?;
            let expr = expr
                .replace("$region", ".*")
                .replace("$__rate_interval", "1m");
            out.push((panel["title"].as_str().unwrap_or("?").to_string(), expr));
        }
    }
    ensure!(!out.is_empty(), "no query in the dashboard");
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_prometheus_scrapes_every_node_alerts_on_dead_letters_and_fills_the_dashboard()
-> anyhow::Result<()> {
    let cluster = cluster()?;
    let url = cluster
        .prometheus
        .as_ref()
        .context("`make up` starts Prometheus")?
        .url
        .clone();
    let deadline = Instant::now() + Duration::from_secs(90);

    // every node is a target that is up, labelled with its region
    let mut nodes = BTreeSet::new();
    for (region, r) in &cluster.regions {
        nodes.insert((region.clone(), r.metrics.clone().context("metrics")?));
        for n in r.nodes.values() {
            nodes.insert((region.clone(), n.metrics.clone().context("metrics")?));
        }
    }
    loop {
        let targets = api(&url, "/api/v1/targets?state=active")?;
        let up: BTreeSet<(String, String)> = targets["activeTargets"]
            .as_array()
            .context("activeTargets")?
            .iter()
            .filter(|t| t["health"] == "up")
            .map(|t| {
                let labels = &t["labels"];
                (
                    labels["geostate_region"].as_str().unwrap_or("").to_string(),
                    labels["instance"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        if nodes.is_subset(&up) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "targets up {up:?}, nodes {nodes:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // writes in every region (write latency, replication lag), and a malformed record
    let key = format!("trips/{}", unique("prometheus"));
    for (region, r) in &cluster.regions {
        let grpc = r.grpc.clone().context("grpc")?;
        let mut state = StateClient::connect(format!("http://{grpc}")).await?;
        for _ in 0..20 {
            state.update(add(&key, 1)).await?;
        }
        let config = common::node_config(r)?;
        let garbage = (key.clone(), b"\xffnot an update record".to_vec());
        produce_all(
            &producer(&r.kafka)?,
            &config.kafka.updates_topic,
            &[garbage],
        )
        .await
        .with_context(|| format!("a malformed record to {region}"))?;
    }

    // GeostateDeadLetters fires in every region
    loop {
        let firing: BTreeSet<String> = query(
            &url,
            r#"ALERTS{alertname="GeostateDeadLetters", alertstate="firing"}"#,
        )?
        .iter()
        .filter_map(|s| s["metric"]["geostate_region"].as_str().map(String::from))
        .collect();
        if cluster.regions.keys().all(|r| firing.contains(r)) {
            println!("GeostateDeadLetters firing in {firing:?}");
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "GeostateDeadLetters fires in {firing:?} only"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // every rule evaluates without error (`unknown` until its first evaluation)
    loop {
        let rules = api(&url, "/api/v1/rules")?;
        let mut unknown = 0;
        for group in rules["groups"].as_array().context("groups")? {
            for rule in group["rules"].as_array().context("rules")? {
                match rule["health"].as_str() {
                    Some("ok") => {}
                    Some("unknown") => unknown += 1,
                    _ => bail!(
                        "rule {} in {}: {}",
                        rule["name"],
                        group["name"],
                        rule["lastError"]
                    ),
                }
            }
        }
        if unknown == 0 {
            break;
        }
        ensure!(Instant::now() < deadline, "{unknown} rules never evaluated");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // every dashboard query returns series
    let queries = dashboard_queries()?;
    let mut empty = Vec::new();
    loop {
        empty.clear();
        for (title, expr) in &queries {
            if query(&url, expr)?.is_empty() {
                empty.push(format!("{title}: {expr}"));
            }
        }
        if empty.is_empty() {
            println!("{} dashboard queries, each returns series", queries.len());
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("dashboard queries without series:\n{}", empty.join("\n"));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
