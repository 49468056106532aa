use super::*;
use crate::config::Config;
use crate::crdt::RegionId;

fn config() -> Config {
    let path = crate::repo_file("regions/us-east-1.toml");
    Config::load(&path).unwrap()
}

fn record(partition: i32, offset: i64, json: &str) -> Record {
    Record {
        partition,
        offset,
        timestamp_ms: Some(1_700_000_000_000),
        key: None,
        payload: Some(json.as_bytes().to_vec()),
    }
}

const MIN: u64 = 60_000;

fn counted(out: &Applied, key: &str, slice: u64) -> u128 {
    match out.states.get(&window::slice_key(key, slice)) {
        Some(CrdtValue::GCounter(c)) => c.value(),
        None => 0,
        Some(other) => panic!("{other:?}"),
    }
}

/// `requests/` counts per minute of event time with 10 s of allowed lateness, and the
/// watermark trails the largest event time by 5 s: an event counts in its minute's
/// slice until the watermark passes that minute's end plus 10 s, then it is late,
/// kept apart, and changes nothing. Without an event time, the Kafka timestamp is the
/// event time.
#[test]
fn windowed_events_count_per_slice_by_event_time_and_late_ones_are_kept_apart() {
    let add = |offset, n, t: Option<u64>| {
        let at = t.map_or(String::new(), |t| format!(r#","event_time":{t}"#));
        record(
            0,
            offset,
            &format!(r#"{{"key":"requests/a","add":{n}{at}}}"#),
        )
    };
    let out = run(
        vec![
            add(1, 1, Some(10 * MIN + 5)),
            add(2, 2, Some(11 * MIN + 20_000)),
            // minute 10 closed at 11:10; the watermark is 11:15
            add(3, 4, Some(10 * MIN + 100)),
            // minute 11 is open
            add(4, 8, Some(11 * MIN + 1)),
            // the Kafka timestamp, far ahead: minute 11 closes
            add(5, 16, None),
            add(6, 32, Some(11 * MIN + 2)),
        ],
        &BTreeMap::new(),
    );
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    assert_eq!(counted(&out, "requests/a", 10 * MIN), 1);
    assert_eq!(counted(&out, "requests/a", 11 * MIN), 2 + 8);
    let kafka_slice = 1_700_000_000_000 - 1_700_000_000_000 % MIN;
    assert_eq!(counted(&out, "requests/a", kafka_slice), 16);
    assert!(
        !out.states.contains_key("requests/a"),
        "only slices are stored"
    );
    let late: Vec<(i64, &Rejection)> = out.late.iter().map(|(r, why)| (r.offset, why)).collect();
    assert_eq!(
        late,
        [
            (
                3,
                &Rejection::Late {
                    key: "requests/a".into(),
                    event_time_ms: 10 * MIN + 100,
                    watermark_ms: 11 * MIN + 15_000,
                    closed_at_ms: 11 * MIN + 10_000,
                }
            ),
            (
                6,
                &Rejection::Late {
                    key: "requests/a".into(),
                    event_time_ms: 11 * MIN + 2,
                    watermark_ms: 1_700_000_000_000 - 5_000,
                    closed_at_ms: 12 * MIN + 10_000,
                }
            ),
        ]
    );
    assert_eq!(
        out.watermarks,
        BTreeMap::from([(0, 1_700_000_000_000 - 5_000)])
    );
    assert_eq!(out.applied, 4);
    assert_eq!(out.offsets, BTreeMap::from([(0, 6)]));
}

/// A source whose partition 0 stored a watermark of 11:15.
struct Watermarked;
impl StateSource for Watermarked {
    type Error = std::convert::Infallible;
    fn state(&self, _key: &str) -> Result<Option<CrdtValue>, Self::Error> {
        Ok(None)
    }
    fn recent_ids(&self, _key: &str) -> Result<VecDeque<String>, Self::Error> {
        Ok(VecDeque::new())
    }
    fn watermark(&self, partition: i32) -> Result<Option<u64>, Self::Error> {
        Ok((partition == 0).then_some(11 * MIN + 15_000))
    }
}

/// A batch judges lateness by the watermark stored with the partition's state (a
/// replay after a restart decides as the first run did), each partition by its own.
#[test]
fn the_stored_watermark_judges_the_next_batch_per_partition() {
    let json = format!(
        r#"{{"key":"requests/a","add":1,"event_time":{}}}"#,
        10 * MIN
    );
    let out = run(vec![record(0, 1, &json), record(1, 1, &json)], &Watermarked);
    let late: Vec<i32> = out.late.iter().map(|(r, _)| r.partition).collect();
    assert_eq!(late, [0]);
    assert_eq!(out.applied, 1);
    assert_eq!(out.watermarks, BTreeMap::from([(1, 10 * MIN - 5_000)]));
}

/// A watermark record (an idle partition's owner appended it) raises its partition's
/// watermark where it stands in the log, never lowers it, and a later event behind it
/// is late.
#[test]
fn a_watermark_record_raises_its_partitions_watermark_in_log_order() {
    let mark = |offset, w: u64| Record {
        key: Some(window::WATERMARK_KEY.to_vec()),
        payload: Some(window::encode_watermark(w)),
        ..record(0, offset, "")
    };
    let event = |offset, t: u64| {
        record(
            0,
            offset,
            &format!(r#"{{"key":"requests/a","add":1,"event_time":{t}}}"#),
        )
    };
    let out = run(
        vec![
            event(1, 10 * MIN),
            mark(2, 12 * MIN),
            mark(3, 11 * MIN),
            event(4, 10 * MIN + 1),
            Record {
                payload: Some(vec![1, 2]),
                ..mark(5, 0)
            },
        ],
        &BTreeMap::new(),
    );
    assert_eq!(out.watermarks, BTreeMap::from([(0, 12 * MIN)]));
    let late: Vec<i64> = out.late.iter().map(|(r, _)| r.offset).collect();
    assert_eq!(late, [4]);
    let refused: Vec<_> = out
        .rejected
        .iter()
        .map(|(r, why)| (r.offset, why.code()))
        .collect();
    assert_eq!(refused, [(5, "malformed")]);
    assert_eq!((out.applied, out.offsets[&0]), (1, 5));
}

/// A windowed write with an id must carry its event time (a retry stamped anew would
/// count in another slice), and its key may not hold the slice separator.
#[test]
fn a_windowed_write_needs_an_event_time_with_an_id_and_a_key_without_nul() {
    let out = run(
        vec![
            record(0, 1, r#"{"key":"requests/a","add":1,"id":"r-1"}"#),
            record(0, 2, r#"{"key":"requests/a\u0000b","add":1}"#),
            record(
                0,
                3,
                r#"{"key":"requests/a","add":1,"id":"r-1","event_time":5}"#,
            ),
            record(
                0,
                4,
                r#"{"key":"requests/a","add":1,"id":"r-1","event_time":5}"#,
            ),
        ],
        &BTreeMap::new(),
    );
    let codes: Vec<_> = out
        .rejected
        .iter()
        .map(|(r, why)| (r.offset, why.code()))
        .collect();
    assert_eq!(
        codes,
        [(1, "id_without_event_time"), (2, "nul_in_windowed_key")]
    );
    assert_eq!((out.applied, out.duplicates), (1, 1));
    assert_eq!(out.recent_ids[&window::slice_key("requests/a", 0)], ["r-1"]);
}

/// A record's own stamp may lead its Kafka timestamp by max-clock-offset (500 ms here)
/// and no more: one further ahead would win its register for ever.
#[test]
fn a_stamp_far_ahead_of_its_record_is_refused() {
    let written_ns: u64 = 1_700_000_000_000 * 1_000_000;
    let set = |offset, value: &str, ahead_ms: u64| {
        let wall = written_ns + ahead_ms * 1_000_000;
        record(
            0,
            offset,
            &format!(
                r#"{{"key":"zones/z","set":"{value}","hlc":{{"wall_nanos":{wall},"logical":0}}}}"#
            ),
        )
    };
    let out = run(
        vec![set(1, "near", 400), set(2, "far", 60_000)],
        &BTreeMap::new(),
    );
    let codes: Vec<_> = out
        .rejected
        .iter()
        .map(|(r, why)| (r.offset, why.code()))
        .collect();
    assert_eq!(codes, [(2, "stamp_ahead")]);
    let CrdtValue::LwwRegister(r) = &out.states["zones/z"] else {
        panic!("a register")
    };
    assert_eq!(r.value(), b"near");
}

/// A windowed event's own time may lead its record's Kafka timestamp by max-clock-offset
/// (500 ms here) and no more: one from a clock a year ahead, or given in microseconds, is
/// refused and leaves its partition's watermark where it was, so the partition's next
/// events still count. Event time 0 is none: the Kafka timestamp counts.
#[test]
fn an_event_time_far_ahead_of_its_record_is_refused_and_moves_no_watermark() {
    let written: u64 = 1_700_000_000_000;
    let add = |offset, n, t: u64| {
        record(
            0,
            offset,
            &format!(r#"{{"key":"requests/a","add":{n},"event_time":{t}}}"#),
        )
    };
    let out = run(
        vec![
            add(1, 1, written - 20_000),
            add(2, 2, written + 500),
            add(3, 4, written + 365 * 24 * 3_600_000),
            add(4, 8, written * 1_000),
            add(5, 16, written - 10_000),
            add(6, 32, 0),
        ],
        &BTreeMap::new(),
    );
    let codes: Vec<_> = (out.rejected.iter())
        .map(|(r, why)| (r.offset, why.code()))
        .collect();
    assert_eq!(codes, [(3, "event_time_ahead"), (4, "event_time_ahead")]);
    assert!(out.late.is_empty(), "{:?}", out.late);
    assert_eq!(out.watermarks, BTreeMap::from([(0, written + 500 - 5_000)]));
    // all four in the minute starting 20 s before the Kafka timestamp
    assert_eq!(
        counted(&out, "requests/a", written - 20_000),
        1 + 2 + 16 + 32
    );
    assert_eq!(out.applied, 4);
}

fn run<S: StateSource>(records: Vec<Record>, stored: &S) -> Applied
where
    S::Error: std::fmt::Debug,
{
    run_granted(records, stored, None)
}

fn run_granted<S: StateSource>(records: Vec<Record>, stored: &S, grants: Option<&Grants>) -> Applied
where
    S::Error: std::fmt::Debug,
{
    run_on(records, stored, grants, None)
}

/// With `partitions`, records off their key's partition of that many are refused.
fn run_on<S: StateSource>(
    records: Vec<Record>,
    stored: &S,
    grants: Option<&Grants>,
    partitions: Option<i32>,
) -> Applied
where
    S::Error: std::fmt::Debug,
{
    let c = config();
    let actor = Actor::new(RegionId::new("us-east-1").unwrap(), 1);
    let ctx = BatchContext {
        actor: &actor,
        format: RecordFormat::Json,
        namespaces: &c.namespaces,
        limits: &c.ingest,
        origin_time: HlcTimestamp::new(5, 0),
        lease: c.lease.as_ref(),
        max_clock_offset: c.max_clock_offset,
        grants,
        partitions,
        out_of_orderness_ms: c.watermark.out_of_orderness.as_millis() as u64,
    };
    apply_batch(records, stored, &ctx).unwrap()
}

/// An owned record's epoch must have been granted: below what is known it applies;
/// above it the batch stops there (that record and the rest pending, its offset not
/// consumed) until the lease group is read; above the epoch read it is refused, and
/// the shard's fence stays where it was.
#[test]
fn an_owned_record_names_an_epoch_the_lease_group_granted() {
    let c = config();
    let shard = owned_shard(c.lease.as_ref(), "surge/a");
    let records = || {
        vec![
            record(0, 1, r#"{"key":"surge/a","set":"1","epoch":3}"#),
            record(
                0,
                2,
                r#"{"key":"surge/a","set":"2","epoch":18446744073709551615}"#,
            ),
            record(1, 7, r#"{"key":"trips/x","add":1}"#),
            record(0, 3, r#"{"key":"surge/a","set":"3","epoch":3}"#),
        ]
    };
    let mut grants = Grants::default();
    grants.known.insert(shard, 3);

    let out = run_granted(records(), &BTreeMap::new(), Some(&grants));
    let pending = out.pending.expect("stopped at the unknown epoch");
    assert_eq!((pending.shard, pending.epoch), (shard, u64::MAX));
    let left: Vec<(i32, i64)> = pending
        .records
        .iter()
        .map(|r| (r.partition, r.offset))
        .collect();
    assert_eq!(left, [(0, 2), (1, 7), (0, 3)]);
    assert_eq!(out.offsets, BTreeMap::from([(0, 1)]));
    assert_eq!(out.applied, 1);
    assert_eq!(out.fences.0.get(&(shard, 0)), Some(&3));

    // the lease group answers epoch 4: the record named one never granted
    grants.read.insert(shard, 4);
    let mut stored = BTreeMap::new();
    stored.extend(out.states);
    let out = run_granted(pending.records, &stored, Some(&grants));
    assert!(out.pending.is_none());
    let codes: Vec<_> = out
        .rejected
        .iter()
        .map(|(r, why)| (r.offset, why.code()))
        .collect();
    assert_eq!(codes, [(2, "epoch_not_granted")]);
    assert_eq!(out.offsets, BTreeMap::from([(0, 3), (1, 7)]));
    // the fence did not rise to the forged epoch: the next record at epoch 3 applied
    assert_eq!(out.fences.0.get(&(shard, 0)), Some(&3));
    let CrdtValue::LwwRegister(r) = &out.states["surge/a"] else {
        panic!("a register")
    };
    assert_eq!(r.value(), b"3");

    // an epoch the lease group has granted since the known one applies
    let out = run_granted(
        vec![record(0, 4, r#"{"key":"surge/a","set":"4","epoch":4}"#)],
        &stored,
        Some(&grants),
    );
    assert!(out.rejected.is_empty() && out.pending.is_none());
    assert_eq!(out.fences.0.get(&(shard, 0)), Some(&4));
}

/// A source whose owned shards already applied epoch 5.
struct Fenced(BTreeMap<String, CrdtValue>);
impl StateSource for Fenced {
    type Error = std::convert::Infallible;
    fn state(&self, key: &str) -> Result<Option<CrdtValue>, Self::Error> {
        Ok(self.0.get(key).cloned())
    }
    fn recent_ids(&self, _key: &str) -> Result<VecDeque<String>, Self::Error> {
        Ok(VecDeque::new())
    }
    fn fence(&self, _shard: ShardId, _partition: i32) -> Result<u64, Self::Error> {
        Ok(5)
    }
}

#[test]
fn a_compare_and_set_applies_only_on_the_value_it_expects_in_log_order() {
    let cas = |offset, expected: &str, value: &str| {
        record(
            0,
            offset,
            &format!(
                r#"{{"key":"surge/c","cas":{{"expected":{expected},"value":"{value}"}},"epoch":6,"hlc":{{"wall_nanos":{offset},"logical":0}}}}"#
            ),
        )
    };
    let records = vec![
        cas(1, "null", "a"),   // never set: applies
        cas(2, "null", "b"),   // it is set now: fails
        cas(3, r#""a""#, "c"), // applies, seeing the first within the same batch
        cas(4, r#""a""#, "d"), // fails: it is "c"
    ];
    let out = run(records, &Fenced(BTreeMap::new()));
    let failed: Vec<_> = out
        .rejected
        .iter()
        .map(|(r, why)| (r.offset, why.to_string()))
        .collect();
    assert_eq!(
        failed,
        [
            (2, r#"compare failed: "surge/c" is "a""#.to_string()),
            (4, r#"compare failed: "surge/c" is "c""#.to_string()),
        ]
    );
    let CrdtValue::LwwRegister(reg) = &out.states["surge/c"] else {
        panic!("surge/c is a register")
    };
    assert_eq!(reg.value(), b"c");
    assert_eq!(out.applied, 2);
}

#[test]
fn owned_writes_below_the_shards_fence_are_refused_and_the_epoch_leads_the_order() {
    let c = config();
    let out = run(
        vec![
            // an old holder's write, appended late: fenced
            record(
                0,
                1,
                r#"{"key":"surge/a","set":"9.9","epoch":4,"hlc":{"wall_nanos":90,"logical":0}}"#,
            ),
            record(
                0,
                2,
                r#"{"key":"surge/a","set":"1.2","epoch":6,"hlc":{"wall_nanos":10,"logical":0}}"#,
            ),
            // within epoch 6 the later clock wins
            record(
                0,
                3,
                r#"{"key":"surge/a","set":"1.4","epoch":6,"hlc":{"wall_nanos":20,"logical":0}}"#,
            ),
            // no epoch at all: not through the holder's API
            record(0, 4, r#"{"key":"surge/b","set":"2.0"}"#),
        ],
        &Fenced(BTreeMap::new()),
    );
    let codes: Vec<_> = out
        .rejected
        .iter()
        .map(|(r, why)| (r.offset, why.code()))
        .collect();
    assert_eq!(codes, [(1, "fenced"), (4, "owned_without_lease")]);
    let CrdtValue::LwwRegister(reg) = &out.states["surge/a"] else {
        panic!("surge/a is a register")
    };
    assert_eq!((reg.value(), reg.stamp().epoch), (&b"1.4"[..], 6));
    // the delta carries the epoch; the fence of the shard rose to it
    assert_eq!(out.outbox[0].epoch, 6);
    let shard = owned_shard(c.lease.as_ref(), "surge/a");
    assert_eq!(out.fences.0[&(shard, 0)], 6);
}

/// Two keys of one shard on two partitions: a later epoch applied on one partition
/// does not fence the other's older one, so each record is decided the same whichever
/// order the partitions' records interleave in (a node replaying the log after a disk
/// loss decides as the lost node did).
#[test]
fn a_records_fence_depends_on_its_own_partition_only() {
    let c = config();
    let lease = c.lease.as_ref();
    let a = "surge/a";
    let shard = owned_shard(lease, a);
    let b = (0..)
        .map(|i| format!("surge/b{i}"))
        .find(|k| owned_shard(lease, k) == shard)
        .unwrap();
    let newer = record(1, 1, &format!(r#"{{"key":"{b}","set":"n","epoch":7}}"#));
    let older = record(0, 1, &format!(r#"{{"key":"{a}","set":"o","epoch":6}}"#));
    for records in [
        vec![newer.clone(), older.clone()],
        vec![older.clone(), newer.clone()],
    ] {
        let out = run(records, &BTreeMap::new());
        assert!(out.rejected.is_empty(), "{:?}", out.rejected);
        assert_eq!(
            out.fences.0,
            BTreeMap::from([((shard, 0), 6), ((shard, 1), 7)])
        );
    }
    // on its own partition the later epoch fences the older one
    let late = record(1, 2, &format!(r#"{{"key":"{b}","set":"l","epoch":6}}"#));
    let out = run(vec![newer, late], &BTreeMap::new());
    let codes: Vec<_> = out.rejected.iter().map(|(_, why)| why.code()).collect();
    assert_eq!(codes, ["fenced"]);
}

/// A record is on its key's partition when its producer partitions like the Java
/// client (murmur2); one that is not is applied, and counted, with the first named.
#[test]
fn records_off_their_keys_partition_are_refused_and_counted() {
    let keys = ["trips/a", "trips/b", "trips/c", "trips/d"];
    let records: Vec<Record> = keys
        .iter()
        .zip(1..)
        .map(|(k, offset)| record(0, offset, &format!(r#"{{"key":"{k}","add":1}}"#)))
        .collect();
    let off: Vec<&str> = keys
        .iter()
        .copied()
        .filter(|k| partition_of(k.as_bytes(), 2) != 0)
        .collect();
    assert!(!off.is_empty() && off.len() < keys.len(), "{off:?}");
    let out = run_on(records, &BTreeMap::new(), None, Some(2));
    assert_eq!(
        (out.applied, out.misrouted),
        (keys.len() - off.len(), off.len())
    );
    assert_eq!(out.first_misrouted, Some((off[0].to_string(), 0, 1)));
    let refused: Vec<&str> = out.rejected.iter().map(|(_, why)| why.code()).collect();
    assert_eq!(refused, vec!["misrouted"; off.len()]);
    assert!(off.iter().all(|k| !out.states.contains_key(*k)), "{off:?}");
}

#[test]
fn a_batch_coalesces_keys_records_offsets_and_rejects_bad_records() {
    let out = run(
        vec![
            record(0, 10, r#"{"key":"drivers/a","add":3}"#),
            record(1, 7, r#"{"key":"drivers/a","add":-1}"#),
            record(0, 11, r#"{"key":"trips/a","add":2}"#),
            record(0, 12, "garbage"),
            record(1, 8, r#"{"key":"zones/a","set":"x"}"#),
        ],
        &BTreeMap::new(),
    );
    assert_eq!(out.applied, 4);
    assert_eq!(out.offsets, BTreeMap::from([(0, 12), (1, 8)]));
    assert_eq!(out.rejected.len(), 1);
    assert_eq!(out.rejected[0].0.offset, 12);
    match &out.states["drivers/a"] {
        CrdtValue::PnCounter(c) => assert_eq!(c.value(), 2),
        other => panic!("{other:?}"),
    }
    assert_eq!(out.outbox.len(), 3, "one delta per touched key");
}

#[test]
fn a_repeated_idempotency_id_applies_once_within_the_window() {
    let out = run(
        vec![
            record(0, 1, r#"{"key":"trips/a","add":5,"id":"x"}"#),
            record(0, 2, r#"{"key":"trips/a","add":5,"id":"x"}"#),
            record(0, 3, r#"{"key":"trips/a","add":1,"id":"y"}"#),
            record(0, 4, r#"{"key":"trips/b","add":1,"id":"x"}"#),
        ],
        &BTreeMap::new(),
    );
    assert_eq!((out.applied, out.duplicates), (3, 1));
    match &out.states["trips/a"] {
        CrdtValue::GCounter(c) => assert_eq!(c.value(), 6),
        other => panic!("{other:?}"),
    }
    assert_eq!(out.recent_ids["trips/a"], ["x", "y"]);
}

/// A retry of an applied write (its id) is a duplicate even where the write itself
/// would be refused now: its window closed since, or its shard's fence moved past its
/// epoch. A refusal would tell the client it was not applied.
#[test]
fn a_retry_of_an_applied_write_is_a_duplicate_after_its_window_closed_or_its_fence_rose() {
    let windowed = |offset, t: u64, id: &str| {
        let json = format!(r#"{{"key":"requests/a","add":1,"event_time":{t},"id":"{id}"}}"#);
        record(0, offset, &json)
    };
    let out = run(
        vec![
            windowed(1, 10 * MIN + 5, "r-1"),
            // the watermark passes minute 10's close (11:10)
            windowed(2, 12 * MIN, "r-2"),
            windowed(3, 10 * MIN + 5, "r-1"),
        ],
        &BTreeMap::new(),
    );
    assert!(out.late.is_empty(), "{:?}", out.late);
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    assert_eq!((out.applied, out.duplicates), (2, 1));
    assert_eq!(counted(&out, "requests/a", 10 * MIN), 1);

    let set = |offset, epoch, id: &str| {
        let json = format!(
            r#"{{"key":"surge/a","set":"{offset}","epoch":{epoch},"id":"{id}","hlc":{{"wall_nanos":{offset},"logical":0}}}}"#
        );
        record(0, offset, &json)
    };
    let out = run(
        vec![set(1, 6, "s-1"), set(2, 7, "s-2"), set(3, 6, "s-1")],
        &Fenced(BTreeMap::new()),
    );
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    assert_eq!((out.applied, out.duplicates), (2, 1));
    let CrdtValue::LwwRegister(reg) = &out.states["surge/a"] else {
        panic!("surge/a is a register")
    };
    assert_eq!(reg.value(), b"2");
}

/// A source whose keys all had ids "x" and "y" applied.
struct Windowed;
impl StateSource for Windowed {
    type Error = std::convert::Infallible;
    fn state(&self, _key: &str) -> Result<Option<CrdtValue>, Self::Error> {
        Ok(None)
    }
    fn recent_ids(&self, _key: &str) -> Result<VecDeque<String>, Self::Error> {
        Ok(VecDeque::from(["x".to_string(), "y".to_string()]))
    }
}

#[test]
fn every_delta_carries_its_keys_whole_id_window() {
    let out = run(
        vec![
            record(0, 1, r#"{"key":"trips/a","add":1,"id":"z"}"#),
            record(0, 2, r#"{"key":"trips/b","add":1}"#),
            record(0, 3, r#"{"key":"trips/c","add":1,"id":"x"}"#),
        ],
        &Windowed,
    );
    let windows: BTreeMap<&str, &[String]> = out
        .outbox
        .iter()
        .map(|d| (d.key.as_str(), d.recent_ids.as_slice()))
        .collect();
    assert_eq!(
        windows,
        BTreeMap::from([
            ("trips/a", &["x", "y", "z"].map(String::from)[..]),
            // no id in this batch: the stored window all the same
            ("trips/b", &["x", "y"].map(String::from)[..]),
        ]),
        "trips/c's record is a duplicate: nothing changed, nothing ships"
    );
    assert_eq!(out.duplicates, 1);
}

#[test]
fn a_refused_record_leaves_the_key_untouched() {
    let first = run(
        vec![record(0, 0, r#"{"key":"trips/a","add":5}"#)],
        &BTreeMap::new(),
    );
    let huge = format!(r#"{{"key":"trips/a","add":{}}}"#, i64::MAX);
    let refused = run(vec![record(0, 1, &huge)], &first.states);
    assert_eq!(refused.rejected.len(), 1, "5 + i64::MAX leaves int64");
    assert!(refused.states.is_empty() && refused.outbox.is_empty());
}

#[test]
fn a_write_that_takes_the_regions_part_out_of_int64_is_refused_and_parts_may_add_up_beyond() {
    let add = |offset, n: i64| record(0, offset, &format!(r#"{{"key":"drivers/a","add":{n}}}"#));
    let full = run(vec![add(0, i64::MAX)], &BTreeMap::new());
    let over = run(vec![add(1, 1)], &full.states);
    let codes: Vec<_> = over.rejected.iter().map(|(_, why)| why.code()).collect();
    assert_eq!(codes, ["overflow"]);
    assert!(over.states.is_empty(), "nothing applied");
    let back = run(vec![add(2, -1)], &full.states);
    assert!(back.rejected.is_empty());
    // another region's part at int64's top does not stop this region writing its own
    let other = Actor::new(RegionId::new("eu-west-1").unwrap(), 1);
    let mut theirs = PnCounter::new();
    theirs.add(&other, i64::MAX).unwrap();
    let stored = BTreeMap::from([("drivers/a".to_string(), CrdtValue::PnCounter(theirs))]);
    let both = run(vec![add(3, i64::MAX)], &stored);
    assert!(both.rejected.is_empty());
    match &both.states["drivers/a"] {
        CrdtValue::PnCounter(c) => assert_eq!(c.value(), 2 * i128::from(i64::MAX)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn adding_zero_creates_no_key() {
    let out = run(
        vec![record(0, 1, r#"{"key":"drivers/a","add":0}"#)],
        &BTreeMap::new(),
    );
    assert_eq!(out.applied, 1);
    assert!(out.states.is_empty() && out.outbox.is_empty());
}

#[test]
fn a_batch_builds_on_stored_state() {
    let first = run(
        vec![record(0, 0, r#"{"key":"trips/a","add":5}"#)],
        &BTreeMap::new(),
    );
    let second = run(
        vec![record(0, 1, r#"{"key":"trips/a","add":2}"#)],
        &first.states,
    );
    match &second.states["trips/a"] {
        CrdtValue::GCounter(c) => assert_eq!(c.value(), 7),
        other => panic!("{other:?}"),
    }
}

#[test]
fn replaying_a_register_write_reproduces_its_stamp() {
    let r = record(2, 99, r#"{"key":"zones/a","set":"x"}"#);
    let a = run(vec![r.clone()], &BTreeMap::new());
    let b = run(vec![r], &BTreeMap::new());
    assert_eq!(a.states, b.states);
    let stamped = record(
        2,
        100,
        r#"{"key":"zones/a","set":"y","hlc":{"wall_nanos":9,"logical":1}}"#,
    );
    match &run(vec![stamped], &BTreeMap::new()).states["zones/a"] {
        CrdtValue::LwwRegister(reg) => assert_eq!(reg.stamp().hlc, HlcTimestamp::new(9, 1)),
        other => panic!("{other:?}"),
    }
}
