use super::*;
use futures_util::FutureExt;

/// A write appended to a partition that then moves away before ingest reached it is
/// answered at once (the next owner applies it), not after the apply timeout; one
/// that ingest's last batch applied is answered applied.
#[test]
fn a_write_is_answered_once_its_partition_moves_away() {
    for last_batch_has_it in [false, true] {
        let shared = IngestShared::default();
        shared.own(0, None, 0);
        shared.reading.send_replace(BTreeSet::from([0]));
        shared.applied.send_replace(BTreeMap::from([(0, 3)]));
        let terms = shared.terms();
        let mut wait = std::pin::pin!(shared.passed(0, 5, &terms));
        assert_eq!(
            wait.as_mut().now_or_never(),
            None,
            "owned and read: it waits"
        );
        shared.disown(&[0]);
        assert_eq!(
            wait.as_mut().now_or_never(),
            None,
            "ingest still reads it: its last batch may hold the record"
        );
        if last_batch_has_it {
            shared.applied.send_replace(BTreeMap::from([(0, 6)]));
        }
        shared.reading.send_replace(BTreeSet::new());
        let expected = if last_batch_has_it {
            Outcome::Applied
        } else {
            Outcome::Moved
        };
        assert_eq!(wait.now_or_never(), Some(expected));
    }
}

/// Partition 0 owned (applied through `applied`, to be replayed to `end`) and read.
fn owned_and_read(applied: i64, end: i64) -> IngestShared {
    let shared = IngestShared::default();
    shared.own(0, Some(applied), end);
    shared.reading.send_replace(BTreeSet::from([0]));
    shared
}

/// A waiter trusts `applied` only while its partition was not taken again since its
/// record was appended: a take sets the offsets the partition's other owner reached,
/// and that owner may have refused the record (a failed compare-and-set, a fence). A
/// partition let go after ingest's last batch applied the record answers applied.
#[test]
fn a_write_is_not_answered_applied_from_another_owners_offsets() {
    // taken back while ingest was stuck in a batch
    let shared = owned_and_read(3, 10);
    let terms = shared.terms();
    let mut wait = std::pin::pin!(shared.passed(0, 5, &terms));
    assert_eq!(wait.as_mut().now_or_never(), None);
    shared.disown(&[0]);
    shared.cut(&[0]);
    assert_eq!(wait.as_mut().now_or_never(), None, "ingest still reads it");
    shared.own(0, Some(10), 12);
    assert_eq!(wait.now_or_never(), Some(Outcome::Moved));

    // taken after the record was appended, before its waiter looked
    let shared = IngestShared::default();
    let terms = shared.terms();
    shared.own(0, Some(10), 12);
    shared.reading.send_replace(BTreeSet::from([0]));
    let wait = shared.passed(0, 5, &terms);
    assert_eq!(wait.now_or_never(), Some(Outcome::Moved));

    // let go after the last batch applied it
    let shared = owned_and_read(3, 10);
    let terms = shared.terms();
    let mut wait = std::pin::pin!(shared.passed(0, 5, &terms));
    assert_eq!(wait.as_mut().now_or_never(), None);
    shared.disown(&[0]);
    shared.applied.send_replace(BTreeMap::from([(0, 6)]));
    shared.reading.send_replace(BTreeSet::new());
    shared.cut(&[0]);
    assert_eq!(wait.now_or_never(), Some(Outcome::Applied));
}

/// The config, store and ingest task of a region whose Kafka is never reached (the
/// records given make no dead letter).
fn offline_ingestor(store: Arc<Store>, shared: Arc<IngestShared>) -> Ingestor {
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
        shared,
        leases: None,
        grants: Grants::default(),
        partitions: 1,
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
    let shared = Arc::new(IngestShared::default());
    let ingestor = offline_ingestor(store.clone(), shared.clone());
    let topic = ingestor.config.kafka.updates_topic.clone();
    let add = |offset| Record {
        partition: 0,
        offset,
        timestamp_ms: Some(1_700_000_000_000),
        key: Some(b"trips/a".to_vec()),
        payload: Some(br#"{"key":"trips/a","add":1}"#.to_vec()),
    };
    shared.own(0, None, 0);
    let read_in = shared.terms();
    shared.disown(&[0]);
    shared.cut(&[0]);
    let part = ingestor
        .apply_part(0, vec![add(0)], Instant::now(), &read_in)
        .await
        .unwrap();
    assert!(matches!(part, Part::Cut));
    assert_eq!(store.source_offsets(&topic).unwrap(), BTreeMap::new());
    assert_eq!(store.get("trips/a").unwrap(), None);
    assert!(shared.applied.borrow().is_empty());

    shared.own(0, None, 0);
    let read_in = shared.terms();
    let part = ingestor
        .apply_part(0, vec![add(0)], Instant::now(), &read_in)
        .await
        .unwrap();
    assert!(matches!(part, Part::Committed(None)));
    assert_eq!(
        store.source_offsets(&topic).unwrap(),
        BTreeMap::from([(0, 0)])
    );
    assert_eq!(shared.applied.borrow().get(&0), Some(&0));
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

#[test]
fn a_refusal_pushed_out_by_later_ones_is_never_answered_as_applied() {
    let mut rejections = Rejections::default();
    let why = Rejection::Malformed("bad".into());
    // partition 0: every even offset refused; partition 1: only offset 5
    for o in 0..2 * RECENT_REJECTIONS as i64 {
        rejections.remember(0, 2 * o, why.clone());
    }
    rejections.remember(1, 5, why.clone());
    // the oldest refusals are forgotten: unknown, not applied
    assert_eq!(rejections.outcome(0, 0), Outcome::Forgotten);
    assert_eq!(rejections.outcome(0, 1), Outcome::Forgotten);
    assert_eq!(
        rejections.outcome(0, 2 * RECENT_REJECTIONS as i64 - 2),
        Outcome::Forgotten
    );
    // the recent ones are known, and so is what lies after the forgotten ones
    let last = 2 * (2 * RECENT_REJECTIONS as i64 - 1);
    assert_eq!(rejections.outcome(0, last), Outcome::Refused(why.clone()));
    assert_eq!(rejections.outcome(0, last - 1), Outcome::Applied);
    assert_eq!(rejections.outcome(1, 5), Outcome::Refused(why));
    assert_eq!(rejections.outcome(1, 4), Outcome::Applied);
}
