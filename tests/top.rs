//! `geostate top` against the cluster `make up` starts: one frame names every node of
//! every region (each region's further nodes found through `Route`), the replication
//! between them, the leases and the clock readings; in a terminal (tmux) it redraws in
//! place.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use common::cluster;

/// `--addr` the first region's node, `--peer` every other region's.
fn top_args(cluster: &common::Cluster) -> anyhow::Result<Vec<String>> {
    let mut args = vec!["top".to_string()];
    for (i, r) in cluster.regions.values().enumerate() {
        let grpc = r.grpc.as_deref().context("a node per region")?;
        args.push(if i == 0 { "--addr" } else { "--peer" }.into());
        args.push(format!("http://{grpc}"));
    }
    Ok(args)
}

#[test]
fn one_frame_names_every_node_its_replication_leases_and_clocks() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let out = Command::new(env!("CARGO_BIN_EXE_geostate"))
        .args(top_args(&cluster)?)
        .arg("--once")
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(!text.contains("DOWN"), "a node did not answer:\n{text}");
    for (region, r) in &cluster.regions {
        let mut nodes = vec![r.grpc.clone().context("grpc")?];
        nodes.extend(r.nodes.values().filter_map(|n| n.grpc.clone()));
        for node in nodes {
            ensure!(
                text.lines()
                    .any(|l| l.starts_with(region.as_str()) && l.contains(&node)),
                "no row for {region}'s node {node}:\n{text}"
            );
        }
        ensure!(
            text.contains(&format!("LEASES as {region} sees them")),
            "{text}"
        );
        for other in cluster.regions.keys().filter(|o| *o != region) {
            ensure!(
                text.lines()
                    .any(|l| l.starts_with(&format!("{region:<16} {other:<16}"))),
                "no replication row from {other} into {region}:\n{text}"
            );
        }
    }
    ensure!(text.contains("CLOCKS") && text.contains(" ms ±"), "{text}");
    Ok(())
}

/// In a terminal it redraws in place: the pane shows one frame, and a later capture a
/// later one (its title's time moved on), with the rate of applied events filled in.
#[test]
fn in_a_terminal_it_redraws_in_place() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let session = format!("geostate-top-{}", std::process::id());
    let mut command = vec![env!("CARGO_BIN_EXE_geostate").to_string()];
    command.extend(top_args(&cluster)?);
    command.extend(["--interval".into(), "0.5".into()]);
    let tmux = |args: &[&str]| -> anyhow::Result<String> {
        let out = Command::new("tmux").args(args).output().context("tmux")?;
        ensure!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "160",
        "-y",
        "60",
        &command.join(" "),
    ])?;
    let title = |pane: &str| {
        pane.lines()
            .find(|l| l.contains("geostate top:"))
            .map(String::from)
    };
    // the pane until it shows what `ready` asks (at most 30 s; the checks below then say
    // what it showed instead)
    let capture_until = |ready: &dyn Fn(&str) -> bool| -> anyhow::Result<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let pane = tmux(&["capture-pane", "-p", "-t", &session])?;
            if ready(&pane) || Instant::now() > deadline {
                return Ok(pane);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let captured = (|| {
        let first = capture_until(&|pane| title(pane).is_some())?;
        let second = capture_until(&|pane| {
            title(pane).is_some() && title(pane) != title(&first) && pane.contains("ago")
        })?;
        anyhow::Ok((first, second))
    })();
    let _ = tmux(&["kill-session", "-t", &session]);
    let (first, second) = captured?;
    println!("{second}");
    for pane in [&first, &second] {
        ensure!(
            pane.matches("geostate top:").count() == 1,
            "not one frame on the screen:\n{pane}"
        );
    }
    ensure!(
        title(&first) != title(&second),
        "the frame was not redrawn:\n{second}"
    );
    // after the first refresh every answering node has a rate, not "-"
    let rows: Vec<&str> = second
        .lines()
        .filter(|l| cluster.regions.keys().any(|r| l.starts_with(r.as_str())) && l.contains("ago"))
        .collect();
    ensure!(!rows.is_empty(), "{second}");
    for row in rows {
        let rate = row.split_whitespace().nth(4).unwrap_or_default();
        ensure!(rate.parse::<f64>().is_ok(), "no rate in {row:?}");
    }
    Ok(())
}
