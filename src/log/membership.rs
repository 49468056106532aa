//! A node's membership in its region's group: Kafka's group protocol (classic,
//! `cooperative-sticky`) decides which of the region's nodes owns which partition of the
//! updates topic. The member reads no record: each partition is paused as soon as it is
//! assigned, and the node reads it with its own reader, positioned at the offsets stored
//! with the state.
//!
//! ```text
//!  join ─► a thread polls the group member ─► Assigned(p…)  (after the group assigned them)
//!                                          ─► Revoked(p…)   (before the group hands them on:
//!                                               the member waits for `done`, or REVOKE_WAIT)
//!  leave ─► unsubscribe: its partitions revoked, then LeaveGroup ─► close ─► thread ends
//! ```
//!
//! Each member's `client.id` is its node's gRPC address, so the group's description is
//! also the region's routing table ([`owners`]). Membership is static (KIP-345,
//! `group.instance.id` = the address): a node restarted after a crash takes its
//! partitions back at once, without waiting for its old session to expire and without a
//! rebalance; one that stops leaves explicitly (an unsubscribe sends LeaveGroup, where a
//! static member's close does not), so its partitions move at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::{ClientContext, TopicPartitionList};
use tokio::sync::mpsc;

use super::{LogError, client_config};
use crate::config::KafkaConfig;

/// Longest a member waits for its node to give up revoked partitions before it lets the
/// group hand them on anyway (the next owner's shipping producer fences this node).
pub const REVOKE_WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);
/// Longest a leaving member polls for its revoke and LeaveGroup to complete.
const LEAVE_POLL: Duration = Duration::from_secs(5);
/// How long a member that saw an error may hold no partition before a new client takes
/// its place.
const REJOIN_AFTER: Duration = Duration::from_secs(5);

/// What the group decided for this node.
#[derive(Debug)]
pub enum Change {
    /// Partitions this node owns from now on.
    Assigned(Vec<i32>),
    /// Partitions this node gives up. `lost`: the group already gave them to another node
    /// (this member's session had expired). Reply on `done` once the node no longer
    /// writes them.
    Revoked {
        partitions: Vec<i32>,
        lost: bool,
        done: std::sync::mpsc::SyncSender<()>,
    },
    /// The node left the group (it stops); nothing follows.
    Left,
}

/// How to join a region's group.
#[derive(Clone, Debug)]
pub struct MembershipSpec {
    pub kafka: KafkaConfig,
    pub group: String,
    pub topic: String,
    /// The node's gRPC address, as other nodes reach it.
    pub address: String,
    /// How long the group waits for a silent member before it moves its partitions.
    pub session_timeout: Duration,
}

/// This node's member of the group, polled on its own thread.
pub struct Membership {
    leaving: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Membership {
    /// Joins the group; what the group decides arrives on the receiver.
    pub fn join(
        spec: &MembershipSpec,
    ) -> Result<(Self, mpsc::UnboundedReceiver<Change>), LogError> {
        let (changes, received) = mpsc::unbounded_channel();
        let mut consumer = member(spec, &changes)?;
        let leaving = Arc::new(AtomicBool::new(false));
        let stop = leaving.clone();
        let spec = spec.clone();
        let thread = std::thread::Builder::new()
            .name("group-member".into())
            .spawn(move || {
                let mut failing_since: Option<Instant> = None;
                while !stop.load(Ordering::Relaxed) {
                    // the partitions are paused: a record would only be a race with the pause
                    if let Some(Err(e)) = consumer.poll(POLL) {
                        tracing::warn!(error = %e, "the region's group member");
                        failing_since.get_or_insert_with(Instant::now);
                    }
                    // a session that expired (its assignment lost) is not an error polled,
                    // and librdkafka may stay without a coordinator for good after it
                    if consumer.context().lost.swap(false, Ordering::Relaxed) {
                        failing_since.get_or_insert_with(Instant::now);
                    }
                    if consumer.assignment().is_ok_and(|a| a.count() > 0) {
                        failing_since = None;
                    }
                    // a member that failed and holds nothing since may never reconnect
                    // (`super::ConsumerSpec` says why): a new client takes its place (its
                    // static identity replaces the old member at the coordinator)
                    if failing_since.is_some_and(|since| since.elapsed() >= REJOIN_AFTER) {
                        match member(&spec, &consumer.context().changes) {
                            Ok(new) => {
                                tracing::warn!(after = ?REJOIN_AFTER, "the region's group member failed and holds no partition: a new client joins in its place");
                                let old = std::mem::replace(&mut consumer, new);
                                // closing may wait for a broker that does not answer
                                std::thread::spawn(move || drop(old));
                                failing_since = None;
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "a new group member could not be made; retrying");
                                failing_since = Some(Instant::now());
                            }
                        }
                    }
                }
                // a static member's close sends no LeaveGroup; an unsubscribe does, after
                // revoking what it holds
                consumer.unsubscribe();
                let until = Instant::now() + LEAVE_POLL;
                while Instant::now() < until && consumer.assignment().is_ok_and(|a| a.count() > 0)
                {
                    consumer.poll(POLL);
                }
                // and a moment for the LeaveGroup request to go out
                consumer.poll(POLL);
                let _ = consumer.context().changes.send(Change::Left);
                drop(consumer);
            })
            .map_err(|e| LogError::Thread(e.to_string()))?;
        Ok((
            Self {
                leaving,
                thread: Some(thread),
            },
            received,
        ))
    }

    /// Leaves the group (blocking: the member revokes its partitions first).
    pub fn leave(mut self) {
        self.leaving.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.leaving.store(true, Ordering::Relaxed);
    }
}

/// A new client of the group, subscribed.
fn member(
    spec: &MembershipSpec,
    changes: &mpsc::UnboundedSender<Change>,
) -> Result<BaseConsumer<Member>, LogError> {
    let consumer: BaseConsumer<Member> =
        member_config(spec, &spec.address).create_with_context(Member {
            topic: spec.topic.clone(),
            changes: changes.clone(),
            lost: AtomicBool::new(false),
        })?;
    consumer.subscribe(&[&spec.topic])?;
    Ok(consumer)
}

/// A member of the group under the static identity `address` (its node's gRPC address).
fn member_config(spec: &MembershipSpec, address: &str) -> rdkafka::ClientConfig {
    let mut config = client_config(&spec.kafka);
    config
        .set("group.id", &spec.group)
        .set("client.id", address)
        .set("group.instance.id", address)
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set(
            "session.timeout.ms",
            spec.session_timeout.as_millis().to_string(),
        )
        // a member learns of a rebalance from its next heartbeat, and a cooperative one
        // takes two rounds: each waits up to this long (a heartbeat is one small request
        // to the group coordinator)
        .set("heartbeat.interval.ms", "100")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    config
}

struct Member {
    topic: String,
    changes: mpsc::UnboundedSender<Change>,
    /// Set when the group took this member's partitions as lost (its session expired).
    lost: AtomicBool,
}

impl ClientContext for Member {}

impl Member {
    fn partitions(&self, tpl: &TopicPartitionList) -> Vec<i32> {
        let mut partitions: Vec<i32> = tpl
            .elements_for_topic(&self.topic)
            .iter()
            .map(|e| e.partition())
            .collect();
        partitions.sort_unstable();
        partitions
    }
}

impl ConsumerContext for Member {
    /// Before the group takes partitions away: the node stops writing them first.
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        let partitions = self.partitions(tpl);
        if partitions.is_empty() {
            return;
        }
        let (done, finished) = std::sync::mpsc::sync_channel(1);
        let lost = consumer.assignment_lost();
        tracing::info!(?partitions, lost, "the group revokes partitions");
        if lost {
            self.lost.store(true, Ordering::Relaxed);
        }
        let revoked = Change::Revoked {
            partitions: partitions.clone(),
            lost,
            done,
        };
        // a node that stopped listening writes nothing any more
        if self.changes.send(revoked).is_ok()
            && finished.recv_timeout(REVOKE_WAIT) == Err(std::sync::mpsc::RecvTimeoutError::Timeout)
        {
            tracing::warn!(?partitions, wait = ?REVOKE_WAIT, "the node did not give up its revoked partitions in time; the group hands them on");
        }
    }

    /// After the group gave partitions: paused (the node reads them itself), then announced.
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Assign(tpl) = rebalance else {
            return;
        };
        if let Err(e) = consumer.pause(tpl) {
            tracing::warn!(error = %e, "pausing the group member's partitions");
        }
        let partitions = self.partitions(tpl);
        tracing::info!(?partitions, "the group assigned partitions");
        let _ = self.changes.send(Change::Assigned(partitions));
    }
}

/// Longest an eviction waits for its stand-in to join, and then to leave.
const EVICT_WAIT: Duration = Duration::from_secs(5);

/// Removes the member `address` from the group at once, for a node that is known to be
/// gone (its session would hold its partitions until it expires): a stand-in client
/// joins with the same static identity, which fences the old member and takes its
/// assignment without a rebalance (KIP-345), then leaves, which hands the partitions to
/// the members that are left. Blocking. Answers whether the stand-in joined before it
/// left (if not, the old member's session decides as before).
///
/// A node that is still alive loses its membership too (its next heartbeat is refused as
/// fenced; it revokes its partitions as lost and joins again with a new client), so call
/// it only for a node that refuses connections.
pub fn evict(spec: &MembershipSpec, address: &str) -> Result<bool, LogError> {
    let joined = Arc::new(AtomicBool::new(false));
    let stand_in: BaseConsumer<StandIn> =
        member_config(spec, address).create_with_context(StandIn {
            joined: joined.clone(),
        })?;
    stand_in.subscribe(&[&spec.topic])?;
    let until = Instant::now() + EVICT_WAIT;
    while !joined.load(Ordering::Relaxed) && Instant::now() < until {
        stand_in.poll(POLL);
    }
    // as a leaving member does (see `Membership::join`): revoke, then LeaveGroup
    stand_in.unsubscribe();
    let until = Instant::now() + EVICT_WAIT;
    while Instant::now() < until && stand_in.assignment().is_ok_and(|a| a.count() > 0) {
        stand_in.poll(POLL);
    }
    stand_in.poll(POLL);
    Ok(joined.load(Ordering::Relaxed))
}

/// The context of an eviction's stand-in: it reads nothing, and notes when it joined.
struct StandIn {
    joined: Arc<AtomicBool>,
}

impl ClientContext for StandIn {}

impl ConsumerContext for StandIn {
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            let _ = consumer.pause(tpl);
            self.joined.store(true, Ordering::Relaxed);
        }
    }
}

/// Who owns which partition of `topic` in `group`: each member's `client.id` (its node's
/// gRPC address) for each partition it was assigned; `None` while the group rebalances
/// (its members' assignments are not known then). Kafka's answer is waited for `within`.
pub async fn owners(
    kafka: &KafkaConfig,
    group: &str,
    topic: &str,
    within: Duration,
) -> Result<Option<BTreeMap<i32, String>>, LogError> {
    let (kafka, group, topic) = (kafka.clone(), group.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let client: BaseConsumer = client_config(&kafka).create()?;
        let groups = client.fetch_group_list(Some(&group), within)?;
        let mut owners = BTreeMap::new();
        for g in groups.groups().iter().filter(|g| g.name() == group) {
            if matches!(g.state(), "PreparingRebalance" | "CompletingRebalance") {
                return Ok(None);
            }
            for member in g.members() {
                let Some(assignment) = member.assignment() else {
                    continue;
                };
                for p in assigned(assignment, &topic) {
                    owners.insert(p, member.client_id().to_string());
                }
            }
        }
        Ok(Some(owners))
    })
    .await?
}

/// The partitions of `topic` in a classic consumer group member's assignment
/// (`ConsumerProtocolAssignment`: version i16, then topics, each a name (i16 length, bytes)
/// and partitions (i32 count, i32 each), then user data). Malformed: none.
fn assigned(bytes: &[u8], topic: &str) -> Vec<i32> {
    fn take<const N: usize>(bytes: &mut &[u8]) -> Option<[u8; N]> {
        let (head, rest) = bytes.split_first_chunk::<N>()?;
        *bytes = rest;
        Some(*head)
    }
    let parse = |mut bytes: &[u8]| -> Option<Vec<i32>> {
        let mut found = Vec::new();
        take::<2>(&mut bytes)?;
        let topics = i32::from_be_bytes(take::<4>(&mut bytes)?);
        for _ in 0..topics.max(0) {
            let len = usize::try_from(i16::from_be_bytes(take::<2>(&mut bytes)?)).ok()?;
            let name = bytes.get(..len)?;
            bytes = &bytes[len..];
            let count = i32::from_be_bytes(take::<4>(&mut bytes)?);
            for _ in 0..count.max(0) {
                let p = i32::from_be_bytes(take::<4>(&mut bytes)?);
                if name == topic.as_bytes() {
                    found.push(p);
                }
            }
        }
        Some(found)
    };
    parse(bytes).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An assignment as the Java client serialises it (version 1, two topics, user data).
    #[test]
    fn a_members_assignment_lists_its_partitions_of_the_topic() {
        let mut bytes = vec![0, 1, 0, 0, 0, 2];
        for (name, partitions) in [("other", vec![0i32]), ("geostate.updates", vec![1, 3])] {
            bytes.extend((name.len() as i16).to_be_bytes());
            bytes.extend(name.as_bytes());
            bytes.extend((partitions.len() as i32).to_be_bytes());
            for p in partitions {
                bytes.extend(p.to_be_bytes());
            }
        }
        bytes.extend((-1i32).to_be_bytes());
        assert_eq!(assigned(&bytes, "geostate.updates"), vec![1, 3]);
        assert_eq!(assigned(&bytes, "other"), vec![0]);
        assert!(assigned(&bytes[..9], "geostate.updates").is_empty());
        assert!(assigned(&[], "geostate.updates").is_empty());
    }
}
