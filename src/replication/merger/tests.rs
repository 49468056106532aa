use super::*;
use crate::clock::ManualClock;
use crate::crdt::{Actor, GCounter};
use futures_util::FutureExt;

/// `d` as the record at offset `at` of partition 0.
fn record(d: &Delta, at: u64) -> Record {
    Record {
        partition: 0,
        offset: at as i64,
        timestamp_ms: None,
        key: Some(d.key.as_bytes().to_vec()),
        payload: Some(d.encode()),
    }
}

fn delta(origin: &str, key: &str, count: u64, at: u64) -> Record {
    let mut c = GCounter::new();
    c.increment(&Actor::new(RegionId::new(origin).unwrap(), 1), count)
        .unwrap();
    let d = Delta {
        key: key.into(),
        origin: RegionId::new(origin).unwrap(),
        state: CrdtValue::GCounter(c),
        origin_time: HlcTimestamp::new(at, 0),
        epoch: 0,
        recent_ids: Vec::new(),
    };
    record(&d, at)
}

/// `merge_batch` with the example region's namespaces and limits.
fn merge<S: StateSource>(
    records: &[Record],
    stored: &S,
    remote: &RegionId,
    hlc: &Hlc,
) -> Result<Merged, S::Error> {
    let path = crate::repo_file("regions/us-east-1.toml");
    let config = Config::load(&path).unwrap();
    merge_batch(
        records,
        stored,
        remote,
        &config.namespaces,
        &config.ingest,
        hlc,
    )
}

const SEC: u64 = 1_000_000_000;

/// `Merger::run` drops its merge future whenever the node's owned partitions change.
/// The merge goes on in the blocking pool: until it has committed, no other writer may
/// read-modify-write state, or the merge's commit rolls that writer's update back (an
/// acknowledged increment lost in every region).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_merge_keeps_other_writers_out_until_it_committed() {
    let config = Arc::new(Config::load(&crate::repo_file("regions/us-east-1.toml")).unwrap());
    let remote = config.replication.remotes[0].clone();
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), 1).unwrap());
    let owned = Arc::new(Partitions::default());
    owned.take(0, None, 0);
    let clock = Arc::new(ManualClock::new(100 * SEC));
    let hlc = Arc::new(Hlc::new(clock, Duration::from_millis(500)));
    let merger = Merger {
        partitions: 1,
        config: config.clone(),
        hlc,
        store: store.clone(),
        owned: owned.clone(),
        freshness: Arc::new(Freshness::default()),
        progress: Arc::new(RemoteProgress::new(remote.clone(), BTreeMap::new())),
    };
    // long enough to be cancelled inside its blocking part; trips/k1 is read first
    let origin = remote.region.as_str();
    let records: Vec<Record> = (1..=20_000u64)
        .map(|i| delta(origin, &format!("trips/k{}", i % 1000), i, i))
        .collect();
    let offsets_id = Merger::offsets_id(&remote);
    let committed = || store.source_offsets(&offsets_id).unwrap().get(&0) == Some(&20_000);

    let read: Owned = owned.subscribe().borrow().clone();
    let mut merging = Box::pin(merger.merge(records, &read));
    assert!(
        merging.as_mut().now_or_never().is_none(),
        "the merge runs on"
    );
    drop(merging); // what Merger::run's select! does when `owned` changes
    if let Some(free) = store
        .writer(store.partition_of_key("trips/k1"))
        .now_or_never()
    {
        assert!(
            committed(),
            "the state lock is free while the cancelled merge has not committed"
        );
        drop(free);
    }

    // an ingest-style read-modify-write under the lock: one local increment
    let local = Actor::new(config.region.clone(), 7);
    let writer = store.writer(store.partition_of_key("trips/k1")).await;
    // were the merge still running, it read trips/k1 (its first key) by now
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut counter = match store.get("trips/k1").unwrap() {
        Some(CrdtValue::GCounter(c)) => c,
        None => GCounter::new(),
        other => panic!("{other:?}"),
    };
    counter.increment(&local, 1).unwrap();
    let states = BTreeMap::from([("trips/k1".to_string(), CrdtValue::GCounter(counter))]);
    store
        .commit(&Commit {
            topic: "",
            states: &states,
            offsets: &BTreeMap::new(),
            outbox: &[],
            recent_ids: &BTreeMap::new(),
            hlc_high_water: HlcTimestamp::new(0, 0),
            remote_applied: None,
            fences: &BTreeMap::new(),
            watermarks: &BTreeMap::new(),
            late: &[],
        })
        .unwrap();
    drop(writer);

    let waited = std::time::Instant::now();
    while !committed() {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the merge never committed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let Some(CrdtValue::GCounter(k1)) = store.get("trips/k1").unwrap() else {
        panic!("trips/k1 is a counter");
    };
    assert_eq!(
        (k1.get(&local), k1.value()),
        (1, 19_002),
        "the local increment survives the merge (remote 19,001 + local 1)"
    );
}

#[test]
fn duplicates_and_reordering_merge_to_the_same_state() {
    let hlc = Hlc::new(
        Arc::new(ManualClock::new(100 * SEC)),
        Duration::from_millis(500),
    );
    let remote = RegionId::new("eu-west-1").unwrap();
    let mut local = GCounter::new();
    local
        .increment(&Actor::new(RegionId::new("us-east-1").unwrap(), 1), 4)
        .unwrap();
    let stored = BTreeMap::from([("trips/a".to_string(), CrdtValue::GCounter(local))]);
    let in_order = [
        delta("eu-west-1", "trips/a", 2, 1),
        delta("eu-west-1", "trips/a", 5, 2),
    ];
    let shuffled = [
        in_order[1].clone(),
        in_order[0].clone(),
        in_order[1].clone(),
    ];
    let a = merge(&in_order, &stored, &remote, &hlc).unwrap();
    let b = merge(&shuffled, &stored, &remote, &hlc).unwrap();
    assert_eq!(a.states, b.states);
    match &a.states["trips/a"] {
        CrdtValue::GCounter(c) => assert_eq!(c.value(), 9, "local 4 + remote 5"),
        other => panic!("{other:?}"),
    }
    assert_eq!(a.newest, BTreeMap::from([(0, HlcTimestamp::new(2, 0))]));
}

/// The id window a delta carries: the last merged one per key wins, cut to the newest
/// `dedup-window` ids; a delta with an id over `max-id-bytes` is refused whole.
#[test]
fn the_last_merged_window_of_a_key_is_kept_cut_to_the_dedup_window() {
    let hlc = Hlc::new(
        Arc::new(ManualClock::new(100 * SEC)),
        Duration::from_millis(500),
    );
    let origin = RegionId::new("us-east-1").unwrap();
    let with_ids = |count, at, ids: Vec<String>| {
        let mut d = Delta::decode(
            delta("us-east-1", "trips/a", count, at)
                .payload
                .as_deref()
                .unwrap(),
        )
        .unwrap();
        d.recent_ids = ids;
        record(&d, at)
    };
    let path = crate::repo_file("regions/us-east-1.toml");
    let config = Config::load(&path).unwrap();
    let window = config.ingest.dedup_window;
    let many: Vec<String> = (0..window + 3).map(|i| i.to_string()).collect();
    let records = [
        with_ids(1, 1, vec!["a".into()]),
        with_ids(2, 2, many.clone()),
        with_ids(3, 3, vec!["x".repeat(config.ingest.max_id_bytes + 1)]),
    ];
    let out = merge(&records, &BTreeMap::new(), &origin, &hlc).unwrap();
    assert_eq!(out.merged, 2);
    assert_eq!(out.recent_ids["trips/a"], &many[3..]);
    let refused: Vec<_> = out.refused.iter().map(|r| (r.1, r.2.code())).collect();
    assert_eq!(refused, [(3, "too_large")]);
}

/// A delta the key's stored state cannot take (its namespace changed type) is refused
/// and leaves the key as it was: a later delta of the batch must not replace the
/// stored state with its own part alone.
#[test]
fn a_refused_merge_leaves_the_key_as_stored_for_the_rest_of_the_batch() {
    let hlc = Hlc::new(
        Arc::new(ManualClock::new(100 * SEC)),
        Duration::from_millis(500),
    );
    let remote = RegionId::new("eu-west-1").unwrap();
    let mut other = crate::crdt::PnCounter::new();
    other
        .add(&Actor::new(RegionId::new("us-east-1").unwrap(), 1), 7)
        .unwrap();
    let stored = BTreeMap::from([("trips/a".to_string(), CrdtValue::PnCounter(other))]);
    let records = [
        delta("eu-west-1", "trips/a", 2, 1),
        delta("eu-west-1", "trips/a", 5, 2),
    ];
    let out = merge(&records, &stored, &remote, &hlc).unwrap();
    assert!(out.states.is_empty(), "{:?}", out.states);
    let refused: Vec<_> = out.refused.iter().map(|r| (r.1, r.2.code())).collect();
    assert_eq!(refused, [(1, "type_mismatch"), (2, "type_mismatch")]);
}

/// A store whose slices of minute 0 are past their retention.
struct Expired;
impl StateSource for Expired {
    type Error = std::convert::Infallible;
    fn state(&self, _key: &str) -> Result<Option<CrdtValue>, Self::Error> {
        Ok(None)
    }
    fn recent_ids(&self, _key: &str) -> Result<VecDeque<String>, Self::Error> {
        Ok(VecDeque::new())
    }
    fn expired(&self, key: &str) -> bool {
        crate::window::split_slice_key(key).1 == Some(0)
    }
}

/// A re-shipped delta of a deleted slice would bring part of it back: not merged.
#[test]
fn a_delta_of_an_expired_slice_is_not_merged() {
    let hlc = Hlc::new(
        Arc::new(ManualClock::new(100 * SEC)),
        Duration::from_millis(500),
    );
    let remote = RegionId::new("eu-west-1").unwrap();
    let (old, new) = (
        crate::window::slice_key("requests/a", 0),
        crate::window::slice_key("requests/a", 60_000),
    );
    let records = [
        delta("eu-west-1", &old, 2, 1),
        delta("eu-west-1", &new, 3, 2),
    ];
    let out = merge(&records, &Expired, &remote, &hlc).unwrap();
    assert_eq!((out.merged, out.expired), (1, 1));
    assert!(out.states.contains_key(&new) && !out.states.contains_key(&old));
}

#[test]
fn heartbeats_are_recorded_per_partition_and_never_merged() {
    let hlc = Hlc::new(
        Arc::new(ManualClock::new(100 * SEC)),
        Duration::from_millis(500),
    );
    let remote = RegionId::new("eu-west-1").unwrap();
    let beat = |origin: &str, partition: i32, offset: i64, wall_nanos: u64| Record {
        partition,
        offset,
        timestamp_ms: None,
        key: Some(crate::replication::HEARTBEAT_KEY.to_vec()),
        payload: Some(
            crate::replication::Heartbeat {
                origin: origin.into(),
                wall_nanos,
                // a partition without windowed records has no watermark
                watermark_ms: (partition == 0).then_some(wall_nanos / 1_000_000),
            }
            .encode(),
        ),
    };
    let records = [
        delta("eu-west-1", "trips/a", 2, 1),
        beat("eu-west-1", 0, 2, 7 * SEC),
        beat("eu-west-1", 1, 0, 9 * SEC),
        beat("eu-west-1", 0, 3, 8 * SEC),
        beat("us-east-1", 2, 0, 9 * SEC),
    ];
    let stored: BTreeMap<String, CrdtValue> = BTreeMap::new();
    let out = merge(&records, &stored, &remote, &hlc).unwrap();
    assert_eq!(out.heartbeats, BTreeMap::from([(0, 8 * SEC), (1, 9 * SEC)]));
    assert_eq!(out.watermarks, BTreeMap::from([(0, 8_000)]));
    assert_eq!(out.merged, 1);
    assert_eq!(out.states.len(), 1);
    let refused: Vec<_> = out.refused.iter().map(|r| (r.0, r.2.code())).collect();
    assert_eq!(refused, [(2, "malformed")], "another region's heartbeat");
    for watermark_ms in [None, Some(0), Some(u64::MAX)] {
        let round_trip = crate::replication::Heartbeat {
            origin: "eu-west-1".into(),
            wall_nanos: 42,
            watermark_ms,
        };
        assert_eq!(
            crate::replication::Heartbeat::decode(&round_trip.encode()),
            Some(round_trip)
        );
    }
    assert_eq!(crate::replication::Heartbeat::decode(b"short"), None);
}

fn owned(epoch: u64, value: &str, at: u64) -> Record {
    let origin = RegionId::new("eu-west-1").unwrap();
    let reg = crate::crdt::LwwRegister::new(
        value.as_bytes().to_vec(),
        crate::crdt::OrderStamp {
            epoch,
            hlc: HlcTimestamp::new(at, 0),
            origin: origin.clone(),
        },
    );
    let d = Delta {
        key: "surge/9q8yy".into(),
        origin,
        state: CrdtValue::LwwRegister(reg),
        origin_time: HlcTimestamp::new(at, 0),
        epoch,
        recent_ids: Vec::new(),
    };
    record(&d, at)
}

#[test]
fn an_owned_delta_below_its_keys_epoch_is_refused_and_a_late_one_for_another_key_merges() {
    let hlc = Hlc::new(
        Arc::new(ManualClock::new(100 * SEC)),
        Duration::from_millis(500),
    );
    let remote = RegionId::new("eu-west-1").unwrap();
    // epoch 3 applied, then a replay of epoch 2 (a later clock does not help it),
    // then epoch 3 again (equal is fine); an epoch-1 write to another key of the shard,
    // accepted by its holder before it was cut off, arrives late: it merges
    let mut late = owned(1, "1.1", 40);
    let mut d = Delta::decode(late.payload.as_deref().unwrap_or_default()).unwrap();
    d.key = "surge/9q8yz".into();
    late.payload = Some(d.encode());
    late.key = Some(d.key.as_bytes().to_vec());
    let records = [
        owned(3, "1.5", 10),
        owned(2, "9.9", 20),
        owned(3, "1.6", 30),
        late,
    ];
    let out = merge(&records, &BTreeMap::new(), &remote, &hlc).unwrap();
    let refused: Vec<_> = out
        .refused
        .iter()
        .map(|(_, o, why)| (*o, why.code()))
        .collect();
    assert_eq!(refused, [(20, "fenced")]);
    let CrdtValue::LwwRegister(reg) = &out.states["surge/9q8yy"] else {
        panic!("a register")
    };
    assert_eq!(reg.value(), b"1.6");
    assert!(
        out.states.contains_key("surge/9q8yz"),
        "the late write merges"
    );
}

#[test]
fn bad_deltas_are_refused_with_a_reason() {
    let hlc = Hlc::new(
        Arc::new(ManualClock::new(100 * SEC)),
        Duration::from_millis(500),
    );
    let remote = RegionId::new("eu-west-1").unwrap();
    let mut garbage = delta("eu-west-1", "trips/a", 1, 1);
    garbage.payload = Some(b"\xff\xff".to_vec());
    // a counter delta that also carries another region's entry (it would inflate it)
    let mut c = GCounter::new();
    for region in ["eu-west-1", "us-east-1"] {
        c.increment(&Actor::new(RegionId::new(region).unwrap(), 1), 7)
            .unwrap();
    }
    let foreign = record(
        &Delta {
            key: "trips/b".into(),
            origin: remote.clone(),
            state: CrdtValue::GCounter(c),
            origin_time: HlcTimestamp::new(5, 0),
            epoch: 0,
            recent_ids: Vec::new(),
        },
        5,
    );
    let mut rekeyed = delta("eu-west-1", "trips/a", 1, 6);
    rekeyed.key = Some(b"trips/other".to_vec());
    let long_key = format!("trips/{}", "k".repeat(2000));
    let records = [
        garbage,
        delta("ap-south-1", "trips/a", 1, 2),
        delta("eu-west-1", "nowhere/a", 1, 3),
        delta("eu-west-1", "zones/a", 1, 4),
        foreign,
        rekeyed,
        delta("eu-west-1", &long_key, 1, 7),
        delta("eu-west-1", "trips/a", 1, 100 * SEC + 400_000_000),
    ];
    let out = merge(&records, &BTreeMap::new(), &remote, &hlc).unwrap();
    let codes: Vec<&str> = out.refused.iter().map(|(_, _, why)| why.code()).collect();
    assert_eq!(
        codes,
        [
            "malformed",
            "wrong_origin",
            "no_namespace",
            "type_mismatch",
            "not_own_part",
            "malformed",
            "too_large"
        ]
    );
    assert_eq!(out.merged, 1, "the delta within max-clock-offset merges");
    assert!(out.held.is_empty());
    assert_eq!(
        out.offsets[&0],
        100 * SEC as i64 + 400_000_000,
        "refused deltas are consumed"
    );
}

/// A delta stamped beyond `max-clock-offset` holds its partition (nothing after it
/// there merges, the offsets stop before it); other partitions go on; once the clock
/// allows, it and what followed merge. A register's own stamp is bounded the same way.
#[test]
fn a_delta_ahead_of_the_clock_is_held_not_dropped() {
    let clock = Arc::new(ManualClock::new(100 * SEC));
    let hlc = Hlc::new(clock.clone(), Duration::from_millis(500));
    let remote = RegionId::new("eu-west-1").unwrap();
    let on = |partition, mut r: Record, offset| {
        r.partition = partition;
        r.offset = offset;
        r
    };
    // a register whose envelope is fine but whose own stamp is 2 s ahead
    let mut register = owned(1, "2.0", 100 * SEC);
    let mut d = Delta::decode(register.payload.as_deref().unwrap_or_default()).unwrap();
    if let CrdtValue::LwwRegister(r) = &mut d.state {
        *r = crate::crdt::LwwRegister::new(
            b"2.0".to_vec(),
            crate::crdt::OrderStamp {
                epoch: 1,
                hlc: HlcTimestamp::new(102 * SEC, 0),
                origin: remote.clone(),
            },
        );
    }
    register.payload = Some(d.encode());
    let records = vec![
        on(0, delta("eu-west-1", "trips/a", 1, 99 * SEC), 10),
        on(0, delta("eu-west-1", "trips/b", 1, 102 * SEC), 11),
        on(0, delta("eu-west-1", "trips/c", 1, 99 * SEC), 12),
        on(1, delta("eu-west-1", "trips/d", 1, 99 * SEC), 40),
        on(2, register, 7),
    ];
    let out = merge(&records, &BTreeMap::new(), &remote, &hlc).unwrap();
    assert!(out.refused.is_empty(), "{:?}", out.refused);
    let merged: Vec<&str> = out.states.keys().map(String::as_str).collect();
    assert_eq!(merged, ["trips/a", "trips/d"]);
    assert_eq!(out.offsets, BTreeMap::from([(0, 10), (1, 40), (2, 6)]));
    let held: Vec<(i32, i64, &str)> = out
        .held
        .iter()
        .map(|(p, (o, why))| (*p, *o, why.code()))
        .collect();
    assert_eq!(held, [(0, 11, "clock_ahead"), (2, 7, "clock_ahead")]);
    assert_eq!(out.hold_for(), Some(Duration::from_millis(1500)));

    // read again from the held offsets once the clock allows: everything merges
    clock.advance(Duration::from_millis(1500));
    let again: Vec<Record> = records
        .into_iter()
        .filter(|r| r.offset > out.offsets[&r.partition])
        .collect();
    let out = merge(&again, &BTreeMap::new(), &remote, &hlc).unwrap();
    assert!(out.held.is_empty() && out.refused.is_empty());
    let merged: Vec<&str> = out.states.keys().map(String::as_str).collect();
    assert_eq!(merged, ["surge/9q8yy", "trips/b", "trips/c"]);
}
