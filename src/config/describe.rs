//! What a validated configuration would run, in words (`geostate check-config`): the
//! listeners, the Kafka topics, the regions merged, the lease group, where checkpoints go
//! and the namespaces. Secrets are never shown.

use std::fmt::Write;
use std::time::Duration;

use super::{CheckpointTarget, Config, LeaseConfig, Ownership, WitnessConfig};

impl Config {
    /// The node this configuration runs, one line per part.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        let tls = if self.tls.is_some() {
            "TLS"
        } else {
            "plaintext"
        };
        self.describe_node(&mut out);
        self.describe_kafka(&mut out);
        match &self.lease {
            Some(lease) => describe_lease(&mut out, lease, tls),
            None => {
                let _ = writeln!(out, "no lease group: owned writes are refused");
            }
        }
        self.describe_checkpoints(&mut out);
        self.describe_namespaces(&mut out);
        self.describe_pricing(&mut out);
        out
    }

    /// The region, the data dir, the clock bound and the API's listeners.
    fn describe_node(&self, out: &mut String) {
        let api_tls = if self.tls.is_some() && !self.api.plaintext {
            "TLS"
        } else {
            "plaintext"
        };
        let _ = writeln!(out, "region {}", self.region);
        let _ = writeln!(out, "data dir {}", self.data_dir.display());
        let _ = writeln!(
            out,
            "clock bound {} (a remote stamp further ahead waits)",
            human(self.max_clock_offset)
        );
        let advertise = self
            .api
            .advertise
            .as_deref()
            .unwrap_or("its listen address");
        let _ = writeln!(
            out,
            "api gRPC {} ({api_tls}, advertised as {advertise}), metrics {} ({api_tls})",
            self.api.grpc_listen, self.api.metrics_listen
        );
    }

    /// This region's Kafka and topics, and the regions whose deltas it merges.
    fn describe_kafka(&self, out: &mut String) {
        let k = &self.kafka;
        let security = k.security.as_ref().map_or("plaintext".to_owned(), |s| {
            let sasl = s
                .sasl
                .as_ref()
                .map_or(String::new(), |(m, u, _)| format!(" {m} as {u}"));
            format!("{}{sasl}", s.protocol)
        });
        let _ = writeln!(out, "kafka {} ({security})", k.bootstrap);
        let _ = writeln!(
            out,
            "  reads {} ({}); ships deltas to {}; dead letters to {}; late events to {}; outputs to {}",
            k.updates_topic,
            format!("{:?}", k.format).to_lowercase(),
            k.deltas_topic,
            k.dlq_topic,
            k.late_topic,
            k.outputs_topic
        );
        for r in &self.replication.remotes {
            let from = if r.bootstrap == k.bootstrap {
                "this region's Kafka".to_owned()
            } else {
                r.bootstrap.clone()
            };
            let _ = writeln!(out, "merges {} from {} on {from}", r.region, r.topic);
        }
        if self.replication.remotes.is_empty() {
            let _ = writeln!(out, "merges no other region");
        }
    }

    /// How often checkpoints are taken, where they go and how many are kept.
    fn describe_checkpoints(&self, out: &mut String) {
        let c = &self.checkpoint;
        let to = match &c.target {
            CheckpointTarget::Local(dir) => format!("{}", dir.display()),
            CheckpointTarget::S3(s3) => format!(
                "s3://{}/{} at {}",
                s3.bucket,
                s3.prefix,
                s3.endpoint.as_deref().unwrap_or("AWS")
            ),
        };
        let every = if c.interval.is_zero() {
            "on demand only".to_owned()
        } else {
            format!("every {}", human(c.interval))
        };
        let restore = if c.restore_on_empty {
            "; an empty data dir restores the newest"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "checkpoints {every} to {to}, newest {} kept{restore}",
            c.keep
        );
    }

    /// Each namespace: its prefix, type, ownership and windows.
    fn describe_namespaces(&self, out: &mut String) {
        for ns in self.namespaces.iter() {
            let ownership = match ns.ownership {
                Ownership::Shared => "shared",
                Ownership::Owned => "owned",
            };
            let window = ns.window.as_ref().map_or(String::new(), |w| {
                format!(
                    ", windows of {} ms (lateness {} ms)",
                    w.size_ms, w.allowed_lateness_ms
                )
            });
            let _ = writeln!(
                out,
                "namespace {} {} {ownership}{window}",
                ns.prefix, ns.crdt
            );
        }
    }

    /// What the pricer computes from which namespaces, and by what (nothing without
    /// `[pricing]`).
    fn describe_pricing(&self, out: &mut String) {
        if let Some(p) = &self.pricing {
            let by = p
                .function
                .as_ref()
                .map_or("the built-in formula".to_owned(), |f| {
                    format!("the function at {}", f.addr)
                });
            let _ = writeln!(
                out,
                "pricing {} / {} into {} by {by}",
                p.demand, p.supply, p.prices
            );
        }
    }
}

impl WitnessConfig {
    /// The witness this configuration runs.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        let tls = if self.tls.is_some() {
            "TLS"
        } else {
            "plaintext"
        };
        let _ = writeln!(out, "witness (lease group member with no region)");
        let _ = writeln!(out, "data dir {}", self.data_dir.display());
        describe_lease(&mut out, &self.lease, tls);
        out
    }
}

fn describe_lease(out: &mut String, lease: &LeaseConfig, tls: &str) {
    let me = if lease.learner > 0 {
        format!("learner {} under member {}", lease.learner, lease.member_id)
    } else if lease.join {
        format!("member {}, joining the running group", lease.member_id)
    } else {
        format!("member {}", lease.member_id)
    };
    let _ = writeln!(
        out,
        "lease group: {me}, listening on {} ({tls}); {} shards, leases of {} renewed every {}",
        lease.listen,
        lease.shards,
        human(lease.duration),
        human(lease.renew_every)
    );
    for m in lease.members.values() {
        let api = if m.api.is_empty() {
            String::new()
        } else {
            format!(", api {}", m.api.join(" "))
        };
        let _ = writeln!(out, "  member {} {} at {}{api}", m.id, m.name(), m.addr);
    }
}

fn human(d: Duration) -> String {
    format!("{d:?}")
}
