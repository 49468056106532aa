//! Durable storage of the lease group (openraft 0.9, storage v2) in RocksDB: the Raft log,
//! the vote, and the state machine — the lease table with the last applied log id and
//! membership, persisted together after every applied batch (so a restart never applies
//! an entry twice or loses one). Every write that Raft needs durable is synced.
//!
//! ```text
//!  column family  key                    value (JSON)
//!  logs           index (u64 BE)         Entry<LeaseRaft>
//!  meta           "vote" | "committed"   Vote | LogId
//!                 "purged"               LogId (the last purged entry)
//!  machine        "state"                Machine {last_applied, membership, table}
//!                 "snapshot"             StoredSnapshot {meta, data}
//! ```

// openraft's traits fix the error type (`StorageError`, a large enum); helpers return it too
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, Membership, OptionalSend, RaftLogReader, RaftSnapshotBuilder,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership, Vote,
};
use rocksdb::{
    ColumnFamilyDescriptor, DB, Direction, IteratorMode, Options, WriteBatch, WriteOptions,
};
use serde::{Deserialize, Serialize};

use super::table::{Bounds, Command, LeaseTable, Outcome, Refusal, ShardId};
use crate::crdt::RegionId;

openraft::declare_raft_types!(
    /// The lease group's Raft types: an entry is a batch of lease commands (a region's
    /// whole renewal round is one entry), its reply their outcomes in order.
    pub LeaseRaft:
        D = Proposal,
        R = Reply,
        NodeId = u64,
        Node = GroupNode,
        AsyncRuntime = super::runtime::LeaseRuntime,
);

/// A node of the lease group as its membership (in the Raft log) lists it: where its Raft
/// service is, and for a region's member its region and API entry addresses. The group's
/// regions are its voters' regions, so adding or removing a region is a membership change
/// every member applies at the same log index.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupNode {
    pub addr: String,
    /// `None` for the witness and for a region's further nodes (learners: their region is
    /// their member's, see [`learner_id`](super::table::learner_id)), and in the
    /// memberships of an earlier version (their regions are the configured members').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<RegionId>,
    /// The region's gRPC API entry addresses (where other regions forward owned writes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api: Vec<String>,
}

impl GroupNode {
    /// A node known by its address only (a learner, the witness).
    pub fn at(addr: impl Into<String>) -> Self {
        Self {
            addr: addr.into(),
            ..Self::default()
        }
    }
}

impl std::fmt::Display for GroupNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.region {
            Some(region) => write!(f, "{} ({region})", self.addr),
            None => f.write_str(&self.addr),
        }
    }
}

/// A region of the group: its voting member's id and API entry addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupRegion {
    pub member: NodeId,
    pub api: Vec<String>,
}

/// The regions of `membership`: each voter's region, from its node, or (a membership
/// written by an earlier version, whose nodes carry no region) from `configured`.
pub fn regions_of(
    membership: &Membership<NodeId, GroupNode>,
    configured: &BTreeMap<NodeId, RegionId>,
) -> BTreeMap<RegionId, GroupRegion> {
    membership
        .voter_ids()
        .filter_map(|id| {
            let node = membership.get_node(&id);
            let region = node
                .and_then(|n| n.region.clone())
                .or_else(|| configured.get(&id).cloned())?;
            let api = node.map(|n| n.api.clone()).unwrap_or_default();
            Some((region, GroupRegion { member: id, api }))
        })
        .collect()
}

/// One log entry's lease commands, applied in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal(pub Vec<Command>);

/// The outcomes of one applied entry's commands, in order (empty for blank and
/// membership entries).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply(pub Vec<Outcome>);

type NodeId = u64;
type Error = StorageError<NodeId>;

const CF_LOGS: &str = "logs";
const CF_META: &str = "meta";
const CF_MACHINE: &str = "machine";

/// A read-only view of the applied lease table and membership, shared with the state
/// machine.
#[derive(Clone)]
pub struct TableView {
    machine: Arc<std::sync::RwLock<Machine>>,
    /// Each configured member's region (see [`regions_of`]).
    configured: BTreeMap<NodeId, RegionId>,
}

impl TableView {
    /// One shard's row, without copying the table.
    pub fn lease(&self, shard: super::table::ShardId) -> Option<super::table::Lease> {
        self.machine
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .table
            .get(shard)
            .cloned()
    }

    /// The group's regions as of the applied log (sorted by name).
    pub fn regions(&self) -> BTreeMap<RegionId, GroupRegion> {
        let machine = self.machine.read().unwrap_or_else(|p| p.into_inner());
        regions_of(machine.membership.membership(), &self.configured)
    }
}

/// Opens (or creates) the lease group's store in `dir`.
/// `configured`: each configured member's region, for a membership written by an earlier
/// version (its nodes carry no region; see [`regions_of`]).
/// `shards`: the group's shard count (a command for another is refused, [`Bounds`]).
pub fn open(
    dir: &Path,
    max_offset_ms: u64,
    configured: BTreeMap<NodeId, RegionId>,
    shards: ShardId,
) -> Result<(LogStore, StateMachine, TableView), Error> {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    let cfs = [CF_LOGS, CF_META, CF_MACHINE]
        .map(|name| ColumnFamilyDescriptor::new(name, Options::default()));
    let db =
        Arc::new(DB::open_cf_descriptors(&opts, dir, cfs).map_err(|e| StorageIOError::write(&e))?);
    let machine = match db
        .get_cf(cf(&db, CF_MACHINE), b"state")
        .map_err(|e| StorageIOError::read_state_machine(&e))?
    {
        Some(bytes) => {
            serde_json::from_slice(&bytes).map_err(|e| StorageIOError::read_state_machine(&e))?
        }
        None => Machine {
            last_applied: None,
            membership: StoredMembership::default(),
            table: LeaseTable::new(max_offset_ms),
        },
    };
    let machine = Arc::new(std::sync::RwLock::new(machine));
    Ok((
        LogStore { db: db.clone() },
        StateMachine {
            db,
            machine: machine.clone(),
            configured: configured.clone(),
            shards,
        },
        TableView {
            machine,
            configured,
        },
    ))
}

fn cf<'a>(db: &'a DB, name: &str) -> &'a rocksdb::ColumnFamily {
    match db.cf_handle(name) {
        Some(cf) => cf,
        None => unreachable!("column family {name} is created at open"),
    }
}

fn synced() -> WriteOptions {
    let mut w = WriteOptions::default();
    w.set_sync(true);
    w
}

fn to_json<T: Serialize>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(value)
}

/// The Raft log and vote.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<DB>,
}

impl LogStore {
    fn meta<T: for<'de> Deserialize<'de>>(&self, key: &[u8]) -> Result<Option<T>, Error> {
        self.db
            .get_cf(cf(&self.db, CF_META), key)
            .map_err(|e| StorageIOError::read(&e))?
            .map(|bytes| {
                serde_json::from_slice(&bytes).map_err(|e| StorageIOError::read(&e).into())
            })
            .transpose()
    }

    fn put_meta<T: Serialize>(&self, key: &[u8], value: &T) -> Result<(), Error> {
        let bytes = to_json(value).map_err(|e| StorageIOError::write(&e))?;
        self.db
            .put_cf_opt(cf(&self.db, CF_META), key, bytes, &synced())
            .map_err(|e| StorageIOError::write(&e).into())
    }

    fn last_entry(&self) -> Result<Option<Entry<LeaseRaft>>, Error> {
        match self
            .db
            .iterator_cf(cf(&self.db, CF_LOGS), IteratorMode::End)
            .next()
        {
            None => Ok(None),
            Some(item) => {
                let (_, v) = item.map_err(|e| StorageIOError::read_logs(&e))?;
                Ok(Some(
                    serde_json::from_slice(&v).map_err(|e| StorageIOError::read_logs(&e))?,
                ))
            }
        }
    }

    fn delete_range(&self, from: u64, to: u64) -> Result<(), Error> {
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(cf(&self.db, CF_LOGS), from.to_be_bytes(), to.to_be_bytes());
        self.db
            .write_opt(batch, &synced())
            .map_err(|e| StorageIOError::write_logs(&e).into())
    }
}

impl RaftLogReader<LeaseRaft> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<LeaseRaft>>, Error> {
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i + 1,
            Bound::Unbounded => 0,
        };
        let mut out = Vec::new();
        for item in self.db.iterator_cf(
            cf(&self.db, CF_LOGS),
            IteratorMode::From(&start.to_be_bytes(), Direction::Forward),
        ) {
            let (k, v) = item.map_err(|e| StorageIOError::read_logs(&e))?;
            let index =
                u64::from_be_bytes(k[..].try_into().map_err(|_| {
                    StorageIOError::read_logs(&std::io::Error::other("bad log key"))
                })?);
            if !range.contains(&index) {
                break;
            }
            out.push(serde_json::from_slice(&v).map_err(|e| StorageIOError::read_logs(&e))?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<LeaseRaft> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<LeaseRaft>, Error> {
        let last_purged_log_id: Option<LogId<NodeId>> = self.meta(b"purged")?;
        let last_log_id = match self.last_entry()? {
            Some(entry) => Some(entry.log_id),
            None => last_purged_log_id,
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), Error> {
        self.put_meta(b"vote", vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, Error> {
        self.meta(b"vote")
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), Error> {
        self.put_meta(b"committed", &committed)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, Error> {
        Ok(self.meta::<Option<LogId<NodeId>>>(b"committed")?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<LeaseRaft>) -> Result<(), Error>
    where
        I: IntoIterator<Item = Entry<LeaseRaft>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let logs = cf(&self.db, CF_LOGS);
        let mut batch = WriteBatch::default();
        for entry in entries {
            let bytes = to_json(&entry).map_err(|e| StorageIOError::write_logs(&e))?;
            batch.put_cf(logs, entry.log_id.index.to_be_bytes(), bytes);
        }
        let result = self.db.write_opt(batch, &synced());
        callback.log_io_completed(
            result
                .as_ref()
                .map(|_| ())
                .map_err(|e| std::io::Error::other(e.to_string())),
        );
        result.map_err(|e| StorageIOError::write_logs(&e).into())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), Error> {
        self.delete_range(log_id.index, u64::MAX)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), Error> {
        self.put_meta(b"purged", &log_id)?;
        self.delete_range(0, log_id.index + 1)
    }
}

/// The state machine's persisted data.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Machine {
    pub last_applied: Option<LogId<NodeId>>,
    pub membership: StoredMembership<NodeId, GroupNode>,
    pub table: LeaseTable,
}

#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, GroupNode>,
    data: Vec<u8>,
}

/// The lease table as a Raft state machine. The regions a command may name are those of
/// the membership applied before it ([`regions_of`]): equal on every member at every log
/// index, whatever each member's configuration says.
pub struct StateMachine {
    db: Arc<DB>,
    machine: Arc<std::sync::RwLock<Machine>>,
    configured: BTreeMap<NodeId, RegionId>,
    shards: ShardId,
}

/// Applies `command` to `table`, for a region with several nodes (learners under its member
/// in `membership`) as follows, since each of its nodes renews and writes on its own:
/// - a release or transfer is refused (`SeveralNodes`): the region's other nodes may
///   still write, so the shard moves only once its lease expires;
/// - a grant or renewal never counts as superseded by another node's later one: its time
///   is taken as the later of its own and the lease's last, which keeps the lease at least
///   `duration` past the proposer's time and the last time monotonic.
///
/// A command outside the group's [`Bounds`] is refused `Impossible` whoever proposed it.
fn apply(
    voters: &BTreeMap<RegionId, NodeId>,
    bounds: &Bounds,
    membership: &StoredMembership<NodeId, GroupNode>,
    table: &mut LeaseTable,
    command: &Command,
) -> Outcome {
    if !bounds.admit(command) {
        return Outcome::Refused {
            reason: Refusal::Impossible,
            current: table.get(command.shard()).cloned(),
        };
    }
    let region = match command {
        Command::Acquire { region, .. }
        | Command::Renew { region, .. }
        | Command::Release { region, .. } => region,
        Command::Transfer { from, .. } => from,
        Command::Read { .. } => return table.apply(command),
    };
    let several = voters.get(region).is_some_and(|&voter| {
        membership
            .membership()
            .nodes()
            .any(|(&id, _)| id != voter && id >> 32 == voter)
    });
    if !several {
        return table.apply(command);
    }
    let current = table.get(command.shard()).cloned();
    let last = current
        .as_ref()
        .filter(|l| &l.holder == region)
        .map_or(0, |l| l.last_ms);
    let mut command = command.clone();
    match &mut command {
        Command::Release { .. } | Command::Transfer { .. } => {
            return Outcome::Refused {
                reason: Refusal::SeveralNodes,
                current,
            };
        }
        Command::Acquire { now_ms, .. } | Command::Renew { now_ms, .. } => {
            *now_ms = (*now_ms).max(last);
        }
        Command::Read { .. } => {}
    }
    table.apply(&command)
}

impl StateMachine {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Machine> {
        self.machine.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Machine> {
        self.machine.write().unwrap_or_else(|p| p.into_inner())
    }

    fn persist(&self) -> Result<(), Error> {
        let bytes = to_json(&*self.read()).map_err(|e| StorageIOError::write_state_machine(&e))?;
        self.db
            .put_cf_opt(cf(&self.db, CF_MACHINE), b"state", bytes, &synced())
            .map_err(|e| StorageIOError::write_state_machine(&e).into())
    }
}

/// Builds a snapshot from a copy of the machine.
pub struct SnapshotBuilder {
    db: Arc<DB>,
    machine: Machine,
}

impl RaftSnapshotBuilder<LeaseRaft> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<LeaseRaft>, Error> {
        let data = to_json(&self.machine).map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        let snapshot_id = match &self.machine.last_applied {
            Some(id) => format!("{}-{}", id.leader_id, id.index),
            None => "empty".into(),
        };
        let meta = SnapshotMeta {
            last_log_id: self.machine.last_applied,
            last_membership: self.machine.membership.clone(),
            snapshot_id,
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: data.clone(),
        };
        let bytes = to_json(&stored).map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        self.db
            .put_cf_opt(cf(&self.db, CF_MACHINE), b"snapshot", bytes, &synced())
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<LeaseRaft> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, GroupNode>), Error> {
        let machine = self.read();
        Ok((machine.last_applied, machine.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Reply>, Error>
    where
        I: IntoIterator<Item = Entry<LeaseRaft>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut replies = Vec::new();
        {
            let mut machine = self.write();
            for entry in entries {
                machine.last_applied = Some(entry.log_id);
                replies.push(match entry.payload {
                    EntryPayload::Blank => Reply::default(),
                    EntryPayload::Normal(proposal) => {
                        let Machine {
                            membership, table, ..
                        } = &mut *machine;
                        let voters: BTreeMap<RegionId, NodeId> =
                            regions_of(membership.membership(), &self.configured)
                                .into_iter()
                                .map(|(region, r)| (region, r.member))
                                .collect();
                        let bounds = Bounds::new(voters.keys().cloned().collect(), self.shards);
                        Reply(
                            (proposal.0.iter())
                                .map(|command| apply(&voters, &bounds, membership, table, command))
                                .collect(),
                        )
                    }
                    EntryPayload::Membership(membership) => {
                        machine.membership = StoredMembership::new(Some(entry.log_id), membership);
                        Reply::default()
                    }
                });
            }
        }
        self.persist()?;
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            db: self.db.clone(),
            machine: self.read().clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, Error> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, GroupNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), Error> {
        let data = snapshot.into_inner();
        let machine: Machine = serde_json::from_slice(&data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        let bytes = to_json(&stored).map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        self.db
            .put_cf_opt(cf(&self.db, CF_MACHINE), b"snapshot", bytes, &synced())
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        *self.write() = machine;
        self.persist()
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<LeaseRaft>>, Error> {
        let Some(bytes) = self
            .db
            .get_cf(cf(&self.db, CF_MACHINE), b"snapshot")
            .map_err(|e| StorageIOError::read_snapshot(None, &e))?
        else {
            return Ok(None);
        };
        let stored: StoredSnapshot =
            serde_json::from_slice(&bytes).map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        Ok(Some(Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use openraft::testing::{StoreBuilder, Suite};

    use super::*;
    use crate::lease::table::learner_id;

    struct Builder;

    impl StoreBuilder<LeaseRaft, LogStore, StateMachine, tempfile::TempDir> for Builder {
        async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), Error> {
            let dir = tempfile::tempdir().map_err(|e| StorageIOError::write(&e))?;
            let (log, machine, _) = open(dir.path(), 100, BTreeMap::new(), 8)?;
            Ok((dir, log, machine))
        }
    }

    fn r(name: &str) -> RegionId {
        RegionId::new(name).unwrap()
    }

    /// Members 1 (us-east-1), 2 (eu-west-1), 3 (the witness), and learners of us-east-1.
    fn group(learners: &[u32]) -> StoredMembership<NodeId, GroupNode> {
        let mut nodes: BTreeMap<NodeId, GroupNode> = (1..=3)
            .map(|id| (id, GroupNode::at(format!("m{id}"))))
            .collect();
        for &n in learners {
            nodes.insert(learner_id(1, n), GroupNode::at(format!("l{n}")));
        }
        let voters = BTreeSet::from([1, 2, 3]);
        StoredMembership::new(None, openraft::Membership::new(vec![voters], nodes))
    }

    /// A region with further nodes (learners) neither releases nor transfers (its other
    /// nodes still write), and one node's renewal is not superseded by another's made on
    /// a clock ahead; a region alone does both as before.
    #[test]
    fn a_region_with_several_nodes_keeps_its_leases_until_expiry() {
        use crate::lease::table::Refusal;
        let voters = BTreeMap::from([(r("us-east-1"), 1), (r("eu-west-1"), 2)]);
        let bounds = Bounds {
            times: 0..u64::MAX,
            ..Bounds::new(voters.keys().cloned().collect(), 8)
        };
        let renew = |now_ms| Command::Renew {
            shard: 0,
            region: r("us-east-1"),
            epoch: 1,
            now_ms,
            duration_ms: 1000,
        };
        let release = Command::Release {
            shard: 0,
            region: r("us-east-1"),
            epoch: 1,
            now_ms: 600,
        };
        let acquire = Command::Acquire {
            shard: 0,
            region: r("us-east-1"),
            now_ms: 0,
            duration_ms: 1000,
        };
        for (learners, several) in [(vec![], false), (vec![1, 2], true)] {
            let membership = group(&learners);
            let mut table = LeaseTable::new(100);
            let apply = |table: &mut LeaseTable, c: &Command| {
                apply(&voters, &bounds, &membership, table, c)
            };
            assert!(matches!(apply(&mut table, &acquire), Outcome::Granted(_)));
            assert!(matches!(
                apply(&mut table, &renew(500)),
                Outcome::Granted(_)
            ));
            // a node whose clock is behind the last renewal's
            match apply(&mut table, &renew(400)) {
                Outcome::Granted(l) if several => {
                    assert_eq!((l.last_ms, l.expires_at_ms), (500, 1500))
                }
                Outcome::Refused {
                    reason: Refusal::Superseded,
                    ..
                } if !several => {}
                other => panic!("several nodes {several}: {other:?}"),
            }
            match apply(&mut table, &release) {
                Outcome::Refused {
                    reason: Refusal::SeveralNodes,
                    current: Some(l),
                } if several => {
                    assert_eq!((l.holder.as_str(), l.expires_at_ms), ("us-east-1", 1500));
                }
                Outcome::Granted(l) if !several => assert_eq!(l.expires_at_ms, 700),
                other => panic!("several nodes {several}: {other:?}"),
            }
        }
        // another region's learners change nothing for this one
        let membership = group(&[1]);
        let mut table = LeaseTable::new(100);
        let eu = |c: Command| match c {
            Command::Acquire {
                now_ms,
                duration_ms,
                shard,
                ..
            } => Command::Acquire {
                shard,
                region: r("eu-west-1"),
                now_ms,
                duration_ms,
            },
            other => other,
        };
        assert!(matches!(
            apply(&voters, &bounds, &membership, &mut table, &eu(acquire)),
            Outcome::Granted(_)
        ));
        let release = Command::Release {
            shard: 0,
            region: r("eu-west-1"),
            epoch: 1,
            now_ms: 600,
        };
        assert!(matches!(
            apply(&voters, &bounds, &membership, &mut table, &release),
            Outcome::Granted(_)
        ));
    }

    /// The regions a command may name are the voters' regions of the membership applied
    /// before it: a region's commands are refused until the entry that makes its member
    /// a voter, and again from the entry that removes it, whatever the configuration says.
    #[tokio::test]
    async fn the_regions_follow_the_membership_in_the_log() -> Result<(), Error> {
        let dir = tempfile::tempdir().map_err(|e| StorageIOError::write(&e))?;
        // the configuration names only the first two regions
        let configured = BTreeMap::from([(1, r("us-east-1")), (2, r("eu-west-1"))]);
        let (_, mut machine, view) = open(dir.path(), 100, configured, 8)?;
        let node = |id: u64, region: Option<&str>| GroupNode {
            addr: format!("m{id}"),
            region: region.map(r),
            api: vec![format!("api{id}")],
        };
        let membership = |voters: &[u64]| {
            let mut nodes = BTreeMap::from([
                (1, node(1, Some("us-east-1"))),
                (2, node(2, Some("eu-west-1"))),
                (3, node(3, None)),
                (4, node(4, Some("ap-southeast-1"))),
            ]);
            nodes.retain(|id, _| *id < 4 || voters.contains(&4) || voters.is_empty());
            let voters = if voters.is_empty() {
                vec![1, 2, 3]
            } else {
                voters.to_vec()
            };
            openraft::Membership::new(vec![voters.into_iter().collect()], nodes)
        };
        let mut index = 0;
        let mut entry = |payload| {
            index += 1;
            let log_id = LogId::new(openraft::CommittedLeaderId::new(1, 1), index);
            Entry::<LeaseRaft> { log_id, payload }
        };
        let acquire = |now_ms| {
            EntryPayload::Normal(Proposal(vec![Command::Acquire {
                shard: 0,
                region: r("ap-southeast-1"),
                now_ms,
                duration_ms: 2000,
            }]))
        };
        let now = 1_800_000_000_000;
        let entries = vec![
            entry(EntryPayload::Membership(membership(&[]))),
            entry(acquire(now)),
            entry(EntryPayload::Membership(membership(&[1, 2, 3, 4]))),
            entry(acquire(now + 1)),
            entry(EntryPayload::Membership(membership(&[1, 2, 3]))),
            entry(acquire(now + 5000)),
        ];
        let replies = machine.apply(entries).await?;
        let outcome = |i: usize| replies[i].0.first().cloned();
        assert!(
            matches!(
                outcome(1),
                Some(Outcome::Refused {
                    reason: Refusal::Impossible,
                    ..
                })
            ),
            "before its member votes: {:?}",
            outcome(1)
        );
        assert!(
            matches!(outcome(3), Some(Outcome::Granted(_))),
            "{:?}",
            outcome(3)
        );
        assert!(
            matches!(
                outcome(5),
                Some(Outcome::Refused {
                    reason: Refusal::Impossible,
                    ..
                })
            ),
            "after its member left: {:?}",
            outcome(5)
        );
        // the view lists the log's regions (not the configured ones), with their API
        let regions = view.regions();
        assert_eq!(
            regions.keys().cloned().collect::<Vec<_>>(),
            [r("eu-west-1"), r("us-east-1")]
        );
        assert_eq!(regions[&r("us-east-1")].api, ["api1"]);
        Ok(())
    }

    /// openraft's own conformance suite for log and state machine storage.
    #[test]
    fn passes_the_openraft_storage_suite() -> Result<(), Error> {
        Suite::test_all(Builder)
    }
}
