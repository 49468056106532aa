use super::*;
use crate::crdt::{Actor, GCounter, RegionId};
use std::sync::Arc;

const PARTITIONS: usize = 4;

fn counter(n: u64) -> CrdtValue {
    let mut c = GCounter::new();
    c.increment(&Actor::new(RegionId::new("us-east-1").unwrap(), 1), n)
        .unwrap();
    CrdtValue::GCounter(c)
}

/// Two keys of different partitions (`trips/d` → 1, `trips/e` → 3 of 4; both 1
/// of 2).
fn keys() -> (String, String) {
    let (a, b) = ("trips/d".to_string(), "trips/e".to_string());
    assert_eq!(partition_of(a.as_bytes(), 4), 1);
    assert_eq!(partition_of(b.as_bytes(), 4), 3);
    (a, b)
}

fn delta(key: &str, n: u64) -> Delta {
    Delta {
        key: key.into(),
        origin: RegionId::new("us-east-1").unwrap(),
        state: counter(n),
        origin_time: HlcTimestamp::new(1, 0),
        epoch: 0,
        recent_ids: Vec::new(),
    }
}

fn commit_two_keys(store: &Store) {
    let (a, b) = keys();
    let states = BTreeMap::from([(a.clone(), counter(3)), (b.clone(), counter(1))]);
    store
        .commit(&Commit {
            topic: "geostate.updates",
            states: &states,
            offsets: &BTreeMap::from([(1, 41), (3, 7)]),
            outbox: &[delta(&a, 3)],
            recent_ids: &BTreeMap::from([(
                a.clone(),
                VecDeque::from(["x".to_string(), "y".to_string()]),
            )]),
            hlc_high_water: HlcTimestamp::new(99, 2),
            remote_applied: Some(RemoteApplied {
                region: &RegionId::new("eu-west-1").unwrap(),
                newest: &BTreeMap::from([(1, HlcTimestamp::new(7, 0))]),
                watermarks: &BTreeMap::from([(1, 90_000)]),
            }),
            fences: &BTreeMap::from([((5, 1), 3)]),
            watermarks: &BTreeMap::new(),
            late: &[],
        })
        .unwrap();
}

/// Slices expire by the lowest watermark over this region and every expected remote
/// one on their partition: compaction drops them, the other keys stay.
#[test]
fn compaction_drops_slices_expired_by_every_regions_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), 1).unwrap();
    let eu = RegionId::new("eu-west-1").unwrap();
    // a slice expires 1000 ms after its start
    store.expire_with(
        vec![eu.clone()],
        Arc::new(|_, slice, lowest| slice + 1000 <= lowest),
    );
    let (old, new) = (
        window::slice_key("requests/a", 0),
        window::slice_key("requests/a", 5000),
    );
    let states = BTreeMap::from([
        (old.clone(), counter(1)),
        (new.clone(), counter(2)),
        ("trips/d".to_string(), counter(3)),
    ]);
    let none = BTreeMap::new();
    let commit = |watermarks: &BTreeMap<i32, u64>, remote: Option<u64>| {
        let remote = remote.map(|w| BTreeMap::from([(0, w)]));
        store
            .commit(&Commit {
                topic: "geostate.updates",
                states: &states,
                offsets: &BTreeMap::new(),
                outbox: &[],
                recent_ids: &BTreeMap::new(),
                hlc_high_water: HlcTimestamp::new(1, 0),
                remote_applied: remote.as_ref().map(|watermarks| RemoteApplied {
                    region: &eu,
                    newest: &none,
                    watermarks,
                }),
                fences: &BTreeMap::new(),
                watermarks,
                late: &[],
            })
            .unwrap();
    };
    // this region is far past, the remote has said nothing: nothing expires
    commit(&BTreeMap::from([(0, 9_000)]), None);
    store.compact();
    assert!(!store.expired(&old));
    assert_eq!(store.get(&old).unwrap(), Some(counter(1)));
    // the remote passes 1000: the first slice expires, and compaction drops it
    commit(&BTreeMap::new(), Some(1_000));
    assert!(store.expired(&old) && !store.expired(&new));
    store.compact();
    assert_eq!(store.get(&old).unwrap(), None);
    assert_eq!(store.get(&new).unwrap(), Some(counter(2)));
    assert_eq!(store.get("trips/d").unwrap(), Some(counter(3)));
    // reopened, the stored watermarks judge alike
    drop(store);
    let store = Store::open(dir.path(), 1).unwrap();
    store.expire_with(
        vec![eu],
        Arc::new(|_, slice, lowest| slice + 1000 <= lowest),
    );
    assert!(store.expired(&old) && !store.expired(&new));
}

/// A batch's watermark and late events are written with its offsets; reopened, the
/// watermark stands, and the late events wait in their partition's outbox until a
/// committed round is known to have shipped them.
#[test]
fn a_watermark_and_late_events_commit_with_the_batch() {
    let dir = tempfile::tempdir().unwrap();
    let mut late: Vec<(String, Vec<u8>)> = [(1, 40), (1, 41), (2, 5)]
        .into_iter()
        .map(|(p, o)| (window::late_key(p, o), vec![1, 2, 3]))
        .collect();
    // an owned output waits and goes the same way
    late.push((window::output_key(1, 39), b"{}".to_vec()));
    {
        let store = Store::open(dir.path(), PARTITIONS).unwrap();
        store
            .commit(&Commit {
                topic: "geostate.updates",
                states: &BTreeMap::new(),
                offsets: &BTreeMap::from([(1, 41), (2, 5)]),
                outbox: &[],
                recent_ids: &BTreeMap::new(),
                hlc_high_water: HlcTimestamp::new(99, 2),
                remote_applied: None,
                fences: &BTreeMap::new(),
                watermarks: &BTreeMap::from([(1, 120_000), (2, 60_000)]),
                late: &late,
            })
            .unwrap();
    }
    let store = Store::open(dir.path(), PARTITIONS).unwrap();
    assert_eq!(store.watermark(1).unwrap(), Some(120_000));
    assert_eq!(store.watermark(0).unwrap(), None);
    let snapshot = store.outbox_snapshot(1, "geostate.updates").unwrap();
    assert_eq!(snapshot.watermarks, BTreeMap::from([(1, 120_000)]));
    let keys: Vec<&str> = snapshot.entries.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        keys,
        [late[0].0.as_str(), late[1].0.as_str(), late[3].0.as_str()]
    );
    assert_eq!(store.drop_records_through(1, 40).unwrap(), 2);
    let left = store
        .outbox_snapshot(1, "geostate.updates")
        .unwrap()
        .entries;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].key, late[1].0);
    assert_eq!(store.outbox_len_in(&BTreeSet::from([2])), 1);

    // a remote's heartbeat delivered again never moves its watermark back
    let eu = RegionId::new("eu-west-1").unwrap();
    for watermark in [50_000, 40_000] {
        store
            .commit(&Commit {
                topic: "remote/eu-west-1/geostate.deltas",
                states: &BTreeMap::new(),
                offsets: &BTreeMap::new(),
                outbox: &[],
                recent_ids: &BTreeMap::new(),
                hlc_high_water: HlcTimestamp::new(99, 2),
                remote_applied: Some(RemoteApplied {
                    region: &eu,
                    newest: &BTreeMap::new(),
                    watermarks: &BTreeMap::from([(1, watermark)]),
                }),
                fences: &BTreeMap::new(),
                watermarks: &BTreeMap::new(),
                late: &[],
            })
            .unwrap();
    }
    assert_eq!(
        store.remote_watermarks(1).unwrap(),
        BTreeMap::from([(eu, 50_000)])
    );
}

#[test]
fn a_commit_survives_reopen_with_its_offsets_outbox_and_clock() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = keys();
    {
        let store = Store::open(dir.path(), PARTITIONS).unwrap();
        assert_eq!(store.incarnation().unwrap(), None);
        store.set_incarnation(7).unwrap();
        commit_two_keys(&store);
    }
    let store = Store::open(dir.path(), PARTITIONS).unwrap();
    assert_eq!(store.incarnation().unwrap(), Some(7));
    // an incarnation some partitions lack (a crash while it was set) is none
    let fresh = tempfile::tempdir().unwrap();
    let partial = Store::open(fresh.path(), PARTITIONS).unwrap();
    partial.parts[0].set_incarnation(7).unwrap();
    assert_eq!(partial.incarnation().unwrap(), None);
    assert_eq!(
        (store.fence(5, 1).unwrap(), store.fence(5, 0).unwrap()),
        (3, 0)
    );
    assert_eq!(store.fences().unwrap(), BTreeMap::from([((5, 1), 3)]));
    let eu = RegionId::new("eu-west-1").unwrap();
    assert_eq!(
        store.remote_watermarks(1).unwrap(),
        BTreeMap::from([(eu, 90_000)])
    );
    assert!(store.remote_watermarks(0).unwrap().is_empty());
    assert_eq!(store.get(&a).unwrap(), Some(counter(3)));
    assert_eq!(store.get("trips/zzz").unwrap(), None);
    assert_eq!(
        store.source_offsets("geostate.updates").unwrap(),
        BTreeMap::from([(1, 41), (3, 7)])
    );
    assert!(store.source_offsets("other").unwrap().is_empty());
    let snapshot = store.outbox_snapshot(1, "geostate.updates").unwrap();
    assert_eq!(snapshot.offsets, BTreeMap::from([(1, 41)]));
    assert_eq!(snapshot.fences, BTreeMap::from([((5, 1), 3)]));
    let other = store.outbox_snapshot(3, "geostate.updates").unwrap();
    assert_eq!(
        (other.entries.len(), other.offsets),
        (0, BTreeMap::from([(3, 7)]))
    );
    assert_eq!(snapshot.hlc_high_water, Some(HlcTimestamp::new(99, 2)));
    let outbox = snapshot.entries;
    assert_eq!(outbox.len(), 1);
    assert_eq!(Delta::decode(&outbox[0].bytes).unwrap().key, a);
    // an entry rewritten since it was read is not cleared
    let stale = vec![OutboxEntry {
        version: outbox[0].version + 1,
        ..outbox[0].clone()
    }];
    assert_eq!(store.clear_outbox(&stale).unwrap(), 0);
    assert_eq!(store.clear_outbox(&outbox).unwrap(), 1);
    assert_eq!(store.outbox_len(), 0);
    assert_eq!(store.recent_ids(&a).unwrap(), ["x", "y"]);
    assert!(store.recent_ids(&b).unwrap().is_empty());
    assert_eq!(
        store.hlc_high_water().unwrap(),
        Some(HlcTimestamp::new(99, 2))
    );
    assert_eq!(
        store.remote_applied(1).unwrap(),
        BTreeMap::from([(RegionId::new("eu-west-1").unwrap(), HlcTimestamp::new(7, 0))])
    );
    assert!(store.remote_applied(3).unwrap().is_empty(), "per partition");
    let page = store.scan("trips/", None, 1).unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].0, a);
    let next = store.scan("trips/", Some(&a), 10).unwrap();
    assert_eq!(
        next.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        [b.as_str()]
    );
}

/// A copy given up with entries it never shipped records who wrote them; discarding it
/// forgets everything of that partition but the node's incarnation and clock, and the
/// other partitions keep theirs. A restore keeps how far a copy holds its own deltas.
#[test]
fn a_discarded_partition_forgets_its_copy_and_a_restore_keeps_its_own_position() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = keys();
    let store = Store::open(dir.path(), PARTITIONS).unwrap();
    commit_two_keys(&store);
    assert_eq!(store.outbox_writer(1).unwrap(), None, "no incarnation yet");
    store.set_incarnation(7).unwrap();
    commit_two_keys(&store);
    assert_eq!(store.outbox_writer(1).unwrap(), Some(7));
    assert_eq!(
        store.outbox_writer(3).unwrap(),
        None,
        "no outbox entry there"
    );
    store.own_deltas_through("geostate.deltas", 1, 12).unwrap();
    store.own_deltas_through("geostate.deltas", 3, 30).unwrap();

    store.discard(1).unwrap();
    assert_eq!(store.get(&a).unwrap(), None);
    assert_eq!(store.outbox_len_in(&BTreeSet::from([1])), 0);
    assert_eq!(store.outbox_writer(1).unwrap(), None);
    assert_eq!(store.recent_ids(&a).unwrap().len(), 0);
    assert_eq!(store.fence(5, 1).unwrap(), 0);
    assert_eq!(
        store.source_offsets("geostate.updates").unwrap(),
        BTreeMap::from([(3, 7)])
    );
    assert_eq!(
        store.bootstrap_offsets("geostate.deltas").unwrap(),
        BTreeMap::from([(3, 30)])
    );
    assert_eq!(store.incarnation().unwrap(), Some(7));
    assert_eq!(
        store.parts[1].hlc_high_water().unwrap(),
        Some(HlcTimestamp::new(99, 2))
    );
    assert_eq!(
        store.get(&b).unwrap(),
        Some(counter(1)),
        "partition 3 is kept"
    );

    // a checkpoint restore reads partition 3 from where its copy holds its deltas,
    // the others from the topic's end when the copy was taken; a savepoint from there
    let ends = BTreeMap::from([(0, 5), (1, 50), (2, 5), (3, 50)]);
    store
        .prepare_bootstrap("geostate.deltas", &ends, "checkpoint x", true)
        .unwrap();
    assert_eq!(
        store.bootstrap_offsets("geostate.deltas").unwrap(),
        BTreeMap::from([(0, 4), (1, 49), (2, 4), (3, 30)])
    );
    store
        .prepare_bootstrap("geostate.deltas", &ends, "savepoint y", false)
        .unwrap();
    assert_eq!(
        store.bootstrap_offsets("geostate.deltas").unwrap(),
        BTreeMap::from([(0, 4), (1, 49), (2, 4), (3, 49)])
    );
}

/// Each partition's instance holds its own keys and positions and nothing of the
/// others, so it can be copied or moved alone.
#[test]
fn a_partitions_instance_holds_its_keys_and_positions_only() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = keys();
    drop({
        let store = Store::open(dir.path(), PARTITIONS).unwrap();
        commit_two_keys(&store);
        store
    });
    let one = PartitionStore::open(&partition_dir(dir.path(), 1), None).unwrap();
    assert_eq!(one.get(&a).unwrap(), Some(counter(3)));
    assert_eq!(one.get(&b).unwrap(), None);
    assert_eq!(
        one.source_offsets("geostate.updates").unwrap(),
        BTreeMap::from([(1, 41)])
    );
    assert_eq!(one.fences().unwrap(), BTreeMap::from([((5, 1), 3)]));
    assert_eq!(one.outbox_len(), 1);
    let three = PartitionStore::open(&partition_dir(dir.path(), 3), None).unwrap();
    assert_eq!(three.get(&b).unwrap(), Some(counter(1)));
    assert_eq!(three.get(&a).unwrap(), None);
    assert!(three.fences().unwrap().is_empty());
    assert_eq!(
        three.hlc_high_water().unwrap(),
        Some(HlcTimestamp::new(99, 2))
    );
    // untouched partitions were not written at all
    let zero = PartitionStore::open(&partition_dir(dir.path(), 0), None).unwrap();
    assert_eq!(zero.hlc_high_water().unwrap(), None);
}

#[test]
fn a_store_opens_only_with_the_partition_count_it_was_written_with() {
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(dir.path(), PARTITIONS).unwrap());
    let err = Store::open(dir.path(), 2).err().unwrap().to_string();
    assert!(
        err.contains("holds 4 partitions, the updates topic has 2"),
        "{err}"
    );
    let err = Store::open(dir.path(), 8).err().unwrap().to_string();
    assert!(
        err.contains("holds 4 partitions, the updates topic has 8"),
        "{err}"
    );
    assert_eq!(Store::open_existing(dir.path()).unwrap().partitions(), 4);
    // a partition's instance lost: never silently recreated empty
    std::fs::remove_dir_all(partition_dir(dir.path(), 1)).unwrap();
    let err = Store::open(dir.path(), PARTITIONS)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("no instance of partitions [1]"), "{err}");
    // a store whose creation stopped before the count was written is completed
    let cut = tempfile::tempdir().unwrap();
    drop(PartitionStore::open(&partition_dir(cut.path(), 0), None).unwrap());
    assert_eq!(Store::open(cut.path(), PARTITIONS).unwrap().partitions(), 4);
    assert_eq!(Store::open(cut.path(), PARTITIONS).unwrap().partitions(), 4);
    // a data dir of one instance for every partition (an older geostate)
    let old = tempfile::tempdir().unwrap();
    drop(PartitionStore::open(old.path(), None).unwrap());
    let err = Store::open(old.path(), PARTITIONS)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("take a savepoint"), "{err}");
}

/// A savepoint's entries (as `for_each_entry` reads them) load each into its
/// partition: a key's by its hash, an offset or fence where it names, the clock as the
/// newest of all partitions'.
#[test]
fn entries_load_into_their_partition_and_the_clock_as_the_newest() {
    let (a, b) = keys();
    let source_dir = tempfile::tempdir().unwrap();
    let source = Store::open(source_dir.path(), PARTITIONS).unwrap();
    source.set_incarnation(7).unwrap();
    commit_two_keys(&source);
    source
        .commit(&Commit {
            topic: "geostate.updates",
            states: &BTreeMap::from([(b.clone(), counter(9))]),
            offsets: &BTreeMap::from([(3, 8)]),
            outbox: &[],
            recent_ids: &BTreeMap::new(),
            hlc_high_water: HlcTimestamp::new(100, 0),
            remote_applied: None,
            fences: &BTreeMap::new(),
            watermarks: &BTreeMap::new(),
            late: &[],
        })
        .unwrap();
    let mut entries = Vec::new();
    source
        .for_each_entry(|cf, k, v| {
            entries.push((cf.to_owned(), k.to_vec(), v.to_vec()));
            Ok::<_, StoreError>(())
        })
        .unwrap();
    let target_dir = tempfile::tempdir().unwrap();
    let target = Store::open(target_dir.path(), PARTITIONS).unwrap();
    target.load(&entries).unwrap();
    assert_eq!(target.get(&a).unwrap(), Some(counter(3)));
    assert_eq!(target.get(&b).unwrap(), Some(counter(9)));
    assert_eq!(target.incarnation().unwrap(), Some(7));
    assert_eq!(
        target.source_offsets("geostate.updates").unwrap(),
        BTreeMap::from([(1, 41), (3, 8)])
    );
    assert_eq!(target.fences().unwrap(), BTreeMap::from([((5, 1), 3)]));
    for part in &target.parts {
        assert_eq!(
            part.hlc_high_water().unwrap(),
            Some(HlcTimestamp::new(100, 0))
        );
    }
    // an offset of a partition the store does not have is refused
    let fewer_dir = tempfile::tempdir().unwrap();
    let fewer = Store::open(fewer_dir.path(), 2).unwrap();
    let err = fewer.load(&entries).err();
    assert!(
        matches!(err, Some(StoreError::NoPartition { partition: 3, .. })),
        "{err:?}"
    );
}

/// Several writers are taken each once, in order, a partition the store does not hold
/// counting as 0's: a set naming 0 and an unknown partition never waits on itself.
#[test]
fn writers_of_a_set_with_an_unknown_partition_are_taken_once() {
    use futures_util::FutureExt;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), 2).unwrap();
    let held = store.writers(BTreeSet::from([0, 9, 1])).now_or_never();
    assert_eq!(held.as_ref().map(Vec::len), Some(2));
    assert!(store.writer(1).now_or_never().is_none(), "1 is held");
    drop(held);
    assert!(store.writer(1).now_or_never().is_some());
}
