//! Crash detection among a region's nodes. The region's group learns that a node died only
//! when the node's session expires (10 s); until then the dead node's partitions stay
//! assigned to it and unavailable. So every node probes the gRPC port of each other node
//! that owns partitions: a port that refuses connections [`REFUSALS`] times in a row means
//! the node's process is gone (a frozen or slow node still accepts connections, and is
//! left to its session), and the live node with the lowest address removes it from the
//! group ([`membership::evict`]): its partitions move within about a second. A node
//! restarted on the same address binds its port before it joins the group, so it is
//! never taken for dead once it is back.
//!
//! ```text
//!  every PROBE_EVERY: connect to each other node owning partitions (the group's owners,
//!    read every OWNERS_EVERY, kept while the group rebalances)
//!    ─► refused REFUSALS times in a row: dead
//!    ─► this node the lowest live address? evict each dead node (once per EVICT_AGAIN,
//!       or again once its port accepted a connection since)
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::log::METADATA_TIMEOUT;
use crate::log::membership::{self, MembershipSpec};
use crate::metrics as m;
use crate::shutdown::stopped;

/// How often each other node's port is probed.
const PROBE_EVERY: Duration = Duration::from_millis(100);
/// Longest a probe waits for a connection (one that times out is no refusal).
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);
/// Refusals in a row that make a node dead: a port refuses only when no process listens
/// on it (a live node binds it before it joins, and keeps it until it left), so two
/// in a row 100 ms apart are no guess, and they leave the eviction 100–200 ms after the
/// kill.
pub const REFUSALS: u32 = 2;
/// How often the group's owners are read.
const OWNERS_EVERY: Duration = Duration::from_secs(1);
/// How long after evicting a node it is not evicted again (the group needs a moment to
/// hand its partitions on, and the owners read meanwhile may still name it), unless it
/// came back since: its port accepted a connection, or the group's owners left it out
/// and then named it again (restarted and rejoined, and dead again, perhaps before any
/// probe reached it).
const EVICT_AGAIN: Duration = Duration::from_secs(10);

/// Probes the region's other nodes and evicts the dead ones from the group.
pub struct Peers {
    /// The group as this node joined it; `address` is this node's.
    pub spec: MembershipSpec,
}

impl Peers {
    pub async fn run(
        self,
        mut stop: watch::Receiver<bool>,
    ) -> Result<(), std::convert::Infallible> {
        let own = self.spec.address.clone();
        let mut others = BTreeSet::new();
        let mut owners_read: Option<Instant> = None;
        let mut refused: BTreeMap<String, u32> = BTreeMap::new();
        // per evicted node: when, and whether the owners read since left it out
        let mut evicted: BTreeMap<String, (Instant, bool)> = BTreeMap::new();
        loop {
            tokio::select! {
                () = stopped(&mut stop) => return Ok(()),
                () = tokio::time::sleep(PROBE_EVERY) => {}
            }
            if owners_read.is_none_or(|at| at.elapsed() >= OWNERS_EVERY) {
                owners_read = Some(Instant::now());
                if let Some(now) = self.other_owners().await {
                    others = now;
                    refused.retain(|a, _| others.contains(a));
                    rejoined(&mut evicted, &others);
                }
            }
            for address in &others {
                let refusals = refused.entry(address.clone()).or_default();
                *refusals = match probe(address, PROBE_TIMEOUT).await {
                    Probe::Refused => *refusals + 1,
                    Probe::Accepted => {
                        // alive again (restarted): evicted again as soon as it dies again
                        evicted.remove(address);
                        0
                    }
                    Probe::NoAnswer => 0,
                };
            }
            let dead: BTreeMap<&String, u32> = refused
                .iter()
                .filter(|(_, n)| **n >= REFUSALS)
                .map(|(a, n)| (a, *n))
                .collect();
            let lowest_live = others
                .iter()
                .filter(|a| !dead.contains_key(a))
                .chain([&own])
                .min();
            if dead.is_empty() || lowest_live != Some(&own) {
                continue;
            }
            // owners read just now: a node that left the group on its own (stopped) while the
            // owners read before still named it is not evicted, for a stand-in joining in
            // the place of a member the group no longer has would join as a new member and
            // take partitions for a moment
            let Some(now) = self.other_owners().await else {
                continue;
            };
            owners_read = Some(Instant::now());
            others = now;
            rejoined(&mut evicted, &others);
            for (address, refusals) in dead {
                if !others.contains(address)
                    || evicted
                        .get(address)
                        .is_some_and(|(at, _)| at.elapsed() < EVICT_AGAIN)
                {
                    continue;
                }
                // refused just now too: a node that stopped and started again between the
                // refusals and this moment (reading the owners takes a while) is back in the
                // group under the same address, and must not be evicted
                if !refuses(address, PROBE_TIMEOUT).await {
                    continue;
                }
                evicted.insert(address.clone(), (Instant::now(), false));
                let (spec, gone) = (self.spec.clone(), address.clone());
                let evicting = Instant::now();
                match tokio::task::spawn_blocking(move || membership::evict(&spec, &gone)).await {
                    Ok(Ok(joined)) => {
                        metrics::counter!(m::NODES_EVICTED).increment(1);
                        let took_ms = evicting.elapsed().as_millis();
                        tracing::warn!(node = %address, refusals, joined, took_ms, "a node of the region refuses connections: removed it from the group, its partitions move now");
                    }
                    Ok(Err(error)) => {
                        tracing::warn!(node = %address, %error, "evicting a node that refuses connections failed; its session decides");
                    }
                    Err(error) => {
                        tracing::warn!(node = %address, %error, "evicting a node that refuses connections failed; its session decides");
                    }
                }
            }
        }
    }

    /// The other nodes owning partitions, as the group names them now (`None`: not read).
    async fn other_owners(&self) -> Option<BTreeSet<String>> {
        let spec = &self.spec;
        let owners = membership::owners(&spec.kafka, &spec.group, &spec.topic, METADATA_TIMEOUT)
            .await
            .ok()??;
        Some(
            owners
                .into_values()
                .filter(|a| *a != spec.address)
                .collect(),
        )
    }
}

/// Notes, for each evicted node, whether the group's owners (`owners`, read just now) left
/// it out; one they name again after leaving it out rejoined since, and is forgotten (it
/// may be evicted again at once).
fn rejoined(evicted: &mut BTreeMap<String, (Instant, bool)>, owners: &BTreeSet<String>) {
    evicted.retain(|address, (_, left_out)| {
        let named = owners.contains(address);
        *left_out |= !named;
        !(named && *left_out)
    });
}

/// What a connection to a node's port met.
#[derive(Debug, PartialEq, Eq)]
enum Probe {
    /// Refused: no process listens there.
    Refused,
    /// Made: a process listens.
    Accepted,
    /// No answer `within` the time given, or another error: no conclusion.
    NoAnswer,
}

/// Connects to `address`, waiting at most `within`.
async fn probe(address: &str, within: Duration) -> Probe {
    match tokio::time::timeout(within, TcpStream::connect(address)).await {
        Ok(Ok(_)) => Probe::Accepted,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Probe::Refused,
        _ => Probe::NoAnswer,
    }
}

/// Whether a connection to `address` is refused (its process is gone); a connection
/// made, or one that does not answer `within`, is no refusal.
pub async fn refuses(address: &str, within: Duration) -> bool {
    probe(address, within).await == Probe::Refused
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An owners read just after the eviction may still name the node: it stays evicted
    /// (not evicted twice for one death); once a read left it out and a later one names it
    /// again, it rejoined, and a second death is evicted at once.
    #[test]
    fn an_evicted_node_is_forgotten_once_the_group_names_it_again_after_leaving_it_out() {
        let mut evicted = BTreeMap::from([("b".to_string(), (Instant::now(), false))]);
        let naming_b = BTreeSet::from(["b".to_string()]);
        rejoined(&mut evicted, &naming_b);
        assert!(evicted.contains_key("b"), "a stale read still names it");
        rejoined(&mut evicted, &BTreeSet::new());
        assert!(evicted.contains_key("b"), "left out: gone from the group");
        rejoined(&mut evicted, &naming_b);
        assert!(evicted.is_empty(), "named again: it rejoined");
    }
}
