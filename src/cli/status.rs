//! What a node and the cluster are doing: `status` (one node's progress, as lines) and
//! `top` (every node of the regions asked, redrawn in place; rendered by `crate::top`).

use std::io::Write;

use super::Node;
use crate::pb;

pub(super) async fn status(node: Node) -> anyhow::Result<()> {
    let mut client = node.admin().await?;
    let s = client.status(pb::StatusRequest {}).await?.into_inner();
    println!(
        "region {} incarnation {} topic {} applied {} dead-lettered {}",
        s.region, s.incarnation, s.updates_topic, s.events_applied, s.events_dead_lettered
    );
    println!("node {} owns partitions {:?}", s.node, s.owned_partitions);
    for p in s.partitions {
        println!(
            "  partition {} applied {} end {} lag {}",
            p.partition, p.applied_offset, p.end_offset, p.lag
        );
    }
    for r in s.remotes {
        println!(
            "remote {} topic {} merged {} refused {} lag {} ms caught-up {}",
            r.region, r.topic, r.deltas_merged, r.deltas_refused, r.lag_ms, r.caught_up
        );
        for p in r.partitions {
            println!(
                "  partition {} merged {} end {} lag {}",
                p.partition, p.applied_offset, p.end_offset, p.lag
            );
        }
    }
    if let Some(c) = s.checkpoint {
        let last = if c.last_id.is_empty() {
            "-"
        } else {
            &c.last_id
        };
        let restored = match c.restored_from.as_str() {
            "" => String::new(),
            from => format!("; restored from {from}"),
        };
        println!(
            "checkpoints to {}: last {last} ({} ms ago, took {} ms, uploaded {} bytes), taken {} failed {}{restored}",
            c.target, c.last_age_ms, c.last_duration_ms, c.last_bytes_uploaded, c.taken, c.failures,
        );
    }
    Ok(())
}

pub(super) async fn top(
    node: Node,
    peers: Vec<String>,
    interval: f64,
    once: bool,
) -> anyhow::Result<()> {
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};
    anyhow::ensure!(
        interval.is_finite() && interval >= 0.2,
        "--interval must be at least 0.2 seconds"
    );
    let seeds: Vec<String> = std::iter::once(node.addr.clone()).chain(peers).collect();
    let mut previous: BTreeMap<String, (u64, Instant)> = BTreeMap::new();
    loop {
        let mut frame = gather(&node, &seeds).await;
        for (addr, status) in &frame.nodes {
            let Ok(s) = status else { continue };
            let now = Instant::now();
            if let Some((applied, at)) = previous.get(addr) {
                let seconds = now.duration_since(*at).as_secs_f64();
                let rate = s.events_applied.saturating_sub(*applied) as f64 / seconds;
                frame.applied_per_second.insert(addr.clone(), rate);
            }
            previous.insert(addr.clone(), (s.events_applied, now));
        }
        let regions: std::collections::BTreeSet<&str> = frame
            .nodes
            .values()
            .filter_map(|s| s.as_ref().ok().map(|s| s.region.as_str()))
            .collect();
        let title = format!(
            "geostate top: {} nodes, {} regions, {} (every {interval} s; Ctrl-C quits)",
            frame.nodes.len(),
            regions.len(),
            time::OffsetDateTime::now_utc()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
        );
        let text = crate::top::render(&frame, &title);
        // written, not printed: a closed pipe (`| head`) ends the command, not a panic
        let mut out = std::io::stdout().lock();
        if once {
            out.write_all(text.as_bytes())?;
            return Ok(());
        }
        // home, clear the screen, draw
        out.write_all(format!("\x1b[H\x1b[2J{text}").as_bytes())?;
        out.flush()?;
        drop(out);
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            () = tokio::time::sleep(Duration::from_secs_f64(interval)) => {}
        }
    }
}

/// One refresh of `geostate top`: the status of every node reachable from `seeds` (each
/// region's nodes found by asking where every partition lives) and each region's leases.
async fn gather(node: &Node, seeds: &[String]) -> crate::top::Frame {
    use std::collections::{BTreeSet, VecDeque};
    let mut frame = crate::top::Frame::default();
    let scheme = |url: &str| url.split_once("://").map_or("http", |(s, _)| s).to_string();
    let bare = |url: &str| url.split_once("://").map_or(url, |(_, a)| a).to_string();
    let mut queue: VecDeque<(String, String)> =
        seeds.iter().map(|s| (scheme(s), bare(s))).collect();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut explored: BTreeSet<String> = BTreeSet::new();
    while let Some((scheme, addr)) = queue.pop_front() {
        if !seen.insert(addr.clone()) {
            continue;
        }
        let at = Node {
            addr: format!("{scheme}://{addr}"),
            ..node.clone()
        };
        let answer = async {
            let mut client = at.admin().await?;
            let status = client.status(pb::StatusRequest {}).await?.into_inner();
            anyhow::Ok((client, status))
        };
        let (mut client, status) =
            match tokio::time::timeout(std::time::Duration::from_secs(3), answer).await {
                Ok(Ok(answered)) => answered,
                Ok(Err(e)) => {
                    frame.nodes.insert(addr, Err(format!("{e:#}")));
                    continue;
                }
                Err(_) => {
                    frame.nodes.insert(addr, Err("no answer within 3 s".into()));
                    continue;
                }
            };
        if explored.insert(status.region.clone()) {
            if let Ok(leases) = client.leases(pb::LeasesRequest::default()).await {
                frame
                    .leases
                    .insert(status.region.clone(), leases.into_inner());
            }
            // the region's other nodes: whoever serves each partition (a key of each,
            // placed as every geostate topic places keys)
            let count = client
                .route(pb::RouteRequest { key: "top".into() })
                .await
                .map_or(0, |r| r.into_inner().partitions);
            for p in 0..count {
                let Some(key) = (0u32..100_000)
                    .map(|i| format!("top/{i}"))
                    .find(|k| crate::log::partition_of(k.as_bytes(), count) == p)
                else {
                    continue;
                };
                if let Ok(route) = client.route(pb::RouteRequest { key }).await {
                    queue.push_back((scheme.clone(), route.into_inner().node));
                }
            }
        }
        frame.nodes.insert(addr, Ok(status));
    }
    frame
}
