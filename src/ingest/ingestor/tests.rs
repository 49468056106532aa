use super::*;
use crate::partition::Outcome;
use futures_util::FutureExt;
use std::collections::BTreeMap;

/// A write appended to a partition that then moves away before ingest reached it is
/// answered at once (the next owner applies it), not after the apply timeout; one
/// that ingest's last batch applied is answered applied.
#[test]
fn a_write_is_answered_once_its_partition_moves_away() {
    for last_batch_has_it in [false, true] {
        let owned = Partitions::default();
        let handle = owned.take(0, Some(3), 0);
        handle.set_reading(true);
        let mut wait = std::pin::pin!(handle.passed(5));
        assert_eq!(
            wait.as_mut().now_or_never(),
            None,
            "owned and read: it waits"
        );
        owned.let_go(&[0]);
        assert_eq!(
            wait.as_mut().now_or_never(),
            None,
            "ingest still reads it: its last batch may hold the record"
        );
        if last_batch_has_it {
            handle.publish([], Some(6));
        }
        // the keeper's give-up, once ingest no longer reads it
        handle.set_reading(false);
        handle.cut();
        let expected = if last_batch_has_it {
            Outcome::Applied
        } else {
            Outcome::Moved
        };
        assert_eq!(wait.now_or_never(), Some(expected));
    }
}

/// Partition 0 owned (applied through `applied`, to be replayed to `end`) and read.
fn owned_and_read(applied: i64, end: i64) -> (Partitions, Arc<PartitionHandle>) {
    let owned = Partitions::default();
    let handle = owned.take(0, Some(applied), end);
    handle.set_reading(true);
    (owned, handle)
}

/// A waiter trusts the offsets of the term it appended its record in only: a take
/// starts a new term at the offsets the partition's other owner reached, and that owner
/// may have refused the record (a failed compare-and-set, a fence). A partition let go
/// after ingest's last batch applied the record answers applied.
#[test]
fn a_write_is_not_answered_applied_from_another_owners_offsets() {
    // taken back while ingest was stuck in a batch
    let (owned, handle) = owned_and_read(3, 10);
    let mut wait = std::pin::pin!(handle.passed(5));
    assert_eq!(wait.as_mut().now_or_never(), None);
    owned.let_go(&[0]);
    assert_eq!(wait.as_mut().now_or_never(), None, "ingest still reads it");
    handle.cut();
    owned.take(0, Some(10), 12);
    assert_eq!(wait.now_or_never(), Some(Outcome::Moved));

    // taken again after the record was appended, before its waiter looked
    let (owned, handle) = owned_and_read(3, 10);
    owned.let_go(&[0]);
    handle.cut();
    owned.take(0, Some(10), 12).set_reading(true);
    let wait = handle.passed(5);
    assert_eq!(wait.now_or_never(), Some(Outcome::Moved));

    // let go after the last batch applied it
    let (owned, handle) = owned_and_read(3, 10);
    let mut wait = std::pin::pin!(handle.passed(5));
    assert_eq!(wait.as_mut().now_or_never(), None);
    owned.let_go(&[0]);
    handle.publish([], Some(6));
    handle.set_reading(false);
    handle.cut();
    assert_eq!(wait.now_or_never(), Some(Outcome::Applied));
}

/// The config, store and ingest task of a region whose Kafka is never reached (the
/// records given make no dead letter).
pub(super) fn offline_ingestor(store: Arc<Store>, owned: Arc<Partitions>) -> Ingestor {
    let mut config = Config::load(&crate::repo_file("regions/us-east-1.toml")).unwrap();
    config.kafka.bootstrap = "127.0.0.1:1".into();
    let config = Arc::new(config);
    let clock = Arc::new(crate::clock::ManualClock::new(1_700_000_000_000_000_000));
    Ingestor {
        actor: Actor::new(config.region.clone(), 1),
        hlc: Arc::new(Hlc::new(clock, Duration::from_millis(500))),
        store,
        source: ConsumerSpec {
            kafka: config.kafka.clone(),
            group: "unused".into(),
            report_end: false,
            topic: config.kafka.updates_topic.clone(),
            partitions: Vec::new(),
            role: "ingest",
        },
        dlq: RenewingProducer::new(&config.kafka, Duration::from_secs(1)).unwrap(),
        owned,
        leases: None,
        granted: Default::default(),
        partition_count: 1,
        config,
    }
}

/// A batch read before its partition was given up without ingest's consent (ingest
/// did not stop reading it in time, or another node fenced this one) is not
/// committed: a catch-up of the copy may have raised its offset and watermark since,
/// and the batch would lower them again. One read in the current term commits.
#[tokio::test]
async fn a_batch_read_before_its_partition_was_cut_is_not_committed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), 1).unwrap());
    let owned = Arc::new(Partitions::default());
    let ingestor = offline_ingestor(store.clone(), owned.clone());
    let topic = ingestor.config.kafka.updates_topic.clone();
    let add = |offset| Record {
        partition: 0,
        offset,
        timestamp_ms: Some(1_700_000_000_000),
        key: Some(b"trips/a".to_vec()),
        payload: Some(br#"{"key":"trips/a","add":1}"#.to_vec()),
    };
    let read_in = owned.take(0, None, 0);
    owned.let_go(&[0]);
    read_in.cut();
    let part = ingestor
        .apply_part(&read_in, vec![add(0)], Instant::now(), &Grants::default())
        .await
        .unwrap();
    assert!(matches!(part, Part::Cut));
    assert_eq!(store.source_offsets(&topic).unwrap(), BTreeMap::new());
    assert_eq!(store.get("trips/a").unwrap(), None);
    assert_eq!(read_in.applied(), None);

    let read_in = owned.take(0, None, 0);
    let part = ingestor
        .apply_part(&read_in, vec![add(0)], Instant::now(), &Grants::default())
        .await
        .unwrap();
    assert!(matches!(part, Part::Committed(None)));
    assert_eq!(
        store.source_offsets(&topic).unwrap(),
        BTreeMap::from([(0, 0)])
    );
    assert_eq!(read_in.applied(), Some(0));
}

#[test]
fn a_dead_letter_carries_at_most_what_the_producer_accepts() {
    let record = |key: usize, value: usize| Record {
        partition: 0,
        offset: 9,
        timestamp_ms: None,
        key: Some(vec![b'k'; key]),
        payload: Some(vec![b'v'; value]),
    };
    let small = record(10, 100);
    let letter = DeadLetter::of(&small, "bad");
    assert_eq!(
        (letter.key.map(<[u8]>::len), letter.payload.len()),
        (Some(10), 100)
    );
    assert_eq!(letter.truncated, None);
    let big = record(5_000, 2_000_000);
    let reason = "é".repeat(3_000);
    let letter = DeadLetter::of(&big, &reason);
    assert_eq!(letter.key.map(<[u8]>::len), Some(DLQ_MAX_KEY));
    assert_eq!(letter.payload.len(), DLQ_MAX_VALUE);
    assert!(letter.reason.len() <= DLQ_MAX_REASON && letter.reason.starts_with('é'));
    assert_eq!(letter.truncated.as_deref(), Some("key=5000,value=2000000"));
}
