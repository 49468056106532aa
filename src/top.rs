//! `geostate top`: one screen of the whole cluster — regions, nodes, partitions, lag,
//! leases, checkpoints, clock offsets — from the nodes' `Admin/Status` and `Admin/Leases`.
//! This module renders a [`Frame`] (what one refresh gathered) as text; the command
//! gathers it and redraws it in place.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::pb;

/// What one refresh gathered.
#[derive(Default)]
pub struct Frame {
    /// Per node address: its status, or why it did not answer.
    pub nodes: BTreeMap<String, Result<pb::StatusResponse, String>>,
    /// Per region: its lease table as one of its nodes sees it.
    pub leases: BTreeMap<String, pb::LeasesResponse>,
    /// Per node address: events applied per second since the previous refresh.
    pub applied_per_second: BTreeMap<String, f64>,
}

/// The frame as text, `title` on its first line.
pub fn render(frame: &Frame, title: &str) -> String {
    let mut out = format!("{title}\n\n");
    nodes(frame, &mut out);
    remotes(frame, &mut out);
    leases(frame, &mut out);
    clocks(frame, &mut out);
    out
}

fn nodes(frame: &Frame, out: &mut String) {
    let _ = writeln!(
        out,
        "{:<16} {:<22} {:<16} {:>8} {:>10} {:>10}  CHECKPOINT",
        "REGION", "NODE", "PARTITIONS", "LAG", "APPLIED/S", "DLQ"
    );
    let mut rows: Vec<(String, String)> = Vec::new();
    for (addr, status) in &frame.nodes {
        let row = match status {
            Err(e) => (String::new(), format!("{:<16} {addr:<22} DOWN: {e}", "?")),
            Ok(s) => {
                let lag: i64 = s.partitions.iter().map(|p| p.lag.max(0)).sum();
                let parts: Vec<String> = s.owned_partitions.iter().map(i32::to_string).collect();
                let rate = frame
                    .applied_per_second
                    .get(addr)
                    .map_or("-".to_string(), |r| format!("{r:.0}"));
                let checkpoint = s.checkpoint.as_ref().map_or("-".to_string(), |c| {
                    if c.last_id.is_empty() {
                        format!("none yet ({} failed)", c.failures)
                    } else {
                        format!("{} ago, {} failed", age(c.last_age_ms), c.failures)
                    }
                });
                (
                    s.region.clone(),
                    format!(
                        "{:<16} {addr:<22} {:<16} {lag:>8} {rate:>10} {:>10}  {checkpoint}",
                        s.region,
                        if parts.is_empty() {
                            "-".to_string()
                        } else {
                            parts.join(",")
                        },
                        s.events_dead_lettered,
                    ),
                )
            }
        };
        rows.push(row);
    }
    rows.sort();
    for (_, row) in rows {
        let _ = writeln!(out, "{row}");
    }
}

fn remotes(frame: &Frame, out: &mut String) {
    let _ = writeln!(
        out,
        "\n{:<16} {:<16} {:<22} {:>10} {:>8} {:>10}  CAUGHT UP",
        "REPLICATION", "FROM", "AT NODE", "LAG", "BACKLOG", "REFUSED"
    );
    for (addr, status) in &frame.nodes {
        let Ok(s) = status else { continue };
        for r in &s.remotes {
            let backlog: i64 = r.partitions.iter().map(|p| p.lag.max(0)).sum();
            let _ = writeln!(
                out,
                "{:<16} {:<16} {addr:<22} {:>10} {backlog:>8} {:>10}  {}",
                s.region,
                r.region,
                age(r.lag_ms),
                r.deltas_refused,
                if r.caught_up { "yes" } else { "no" }
            );
        }
    }
}

fn leases(frame: &Frame, out: &mut String) {
    for (region, l) in &frame.leases {
        let held = l.shards.iter().filter(|s| s.held_here).count();
        let _ = writeln!(
            out,
            "\nLEASES as {region} sees them: leader member {}, term {}, {held} of {} shards held here",
            l.leader,
            l.term,
            l.shards.len()
        );
        let mut by_holder: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for s in &l.shards {
            let holder = if s.holder.is_empty() {
                "(none)"
            } else {
                &s.holder
            };
            let expiry = if s.expires_in_ms < 0 { " ended" } else { "" };
            by_holder
                .entry(holder)
                .or_default()
                .push(format!("{}@{}{expiry}", s.shard, s.epoch));
        }
        for (holder, shards) in by_holder {
            let _ = writeln!(out, "  {holder:<16} shard@epoch {}", shards.join(" "));
        }
    }
}

fn clocks(frame: &Frame, out: &mut String) {
    let mut any = false;
    for (region, l) in &frame.leases {
        if l.clocks.is_empty() {
            continue;
        }
        if !any {
            let _ = writeln!(out, "\nCLOCKS (other member's wall clock minus this one's)");
            any = true;
        }
        let readings: Vec<String> = l
            .clocks
            .iter()
            .map(|c| {
                format!(
                    "member {} {:+.1} ms ±{:.1}",
                    c.member,
                    c.offset_micros as f64 / 1e3,
                    c.uncertainty_micros as f64 / 1e3
                )
            })
            .collect();
        let _ = writeln!(out, "  {region:<16} {}", readings.join("   "));
    }
}

/// `ms` as a short duration: `850ms`, `12.3s`, `4m05s`.
fn age(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1e3),
        _ => format!("{}m{:02}s", ms / 60_000, (ms % 60_000) / 1_000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(region: &str, node: &str, owned: &[i32], lag: i64) -> pb::StatusResponse {
        pb::StatusResponse {
            region: region.into(),
            node: node.into(),
            owned_partitions: owned.to_vec(),
            partitions: owned
                .iter()
                .map(|&p| pb::PartitionStatus {
                    partition: p,
                    applied_offset: 10,
                    end_offset: 10 + lag,
                    lag,
                })
                .collect(),
            remotes: vec![pb::RemoteStatus {
                region: "eu-west-1".into(),
                lag_ms: 1_500,
                caught_up: true,
                ..Default::default()
            }],
            checkpoint: Some(pb::CheckpointStatus {
                last_id: "17".into(),
                last_age_ms: 65_000,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_frame_shows_every_node_its_lag_leases_and_clocks() {
        let mut frame = Frame::default();
        frame.nodes.insert(
            "10.0.0.1:50051".into(),
            Ok(status("us-east-1", "10.0.0.1:50051", &[0, 1], 3)),
        );
        frame
            .nodes
            .insert("10.0.0.2:50051".into(), Err("connection refused".into()));
        frame
            .applied_per_second
            .insert("10.0.0.1:50051".into(), 812.4);
        frame.leases.insert(
            "us-east-1".into(),
            pb::LeasesResponse {
                region: "us-east-1".into(),
                leader: 2,
                term: 7,
                shards: vec![
                    pb::ShardLease {
                        shard: 0,
                        holder: "us-east-1".into(),
                        epoch: 4,
                        expires_in_ms: 1_500,
                        held_here: true,
                        ..Default::default()
                    },
                    pb::ShardLease {
                        shard: 1,
                        holder: "eu-west-1".into(),
                        epoch: 9,
                        expires_in_ms: -20,
                        ..Default::default()
                    },
                ],
                clocks: vec![pb::MemberClock {
                    member: 2,
                    offset_micros: -1_250,
                    uncertainty_micros: 300,
                }],
            },
        );
        let text = render(&frame, "geostate top");
        println!("{text}");
        for expected in [
            "us-east-1        10.0.0.1:50051         0,1                     6        812",
            "10.0.0.2:50051         DOWN: connection refused",
            "1m05s ago, 0 failed",
            "us-east-1        eu-west-1        10.0.0.1:50051               1.5s",
            "leader member 2, term 7, 1 of 2 shards held here",
            "us-east-1        shard@epoch 0@4",
            "eu-west-1        shard@epoch 1@9 ended",
            "member 2 -1.2 ms ±0.3",
        ] {
            assert!(text.contains(expected), "{expected:?} not in\n{text}");
        }
    }

    #[test]
    fn ages_read_at_a_glance() {
        assert_eq!(age(850), "850ms");
        assert_eq!(age(12_345), "12.3s");
        assert_eq!(age(245_000), "4m05s");
    }
}
