//! Mutation fuzzing of every decoder that reads bytes from outside the process: update
//! records (JSON and protobuf), deltas, resume points, heartbeats, stored state values,
//! savepoint records and checkpoint manifests. Each target starts from its committed
//! corpus (`fuzz/corpus/<target>/`: valid encodings and edge cases) and runs a fixed number
//! of seeded mutations of it (bit flips, byte values, insertions, deletions, repeats,
//! truncations, splices with another entry): every input must decode or be refused, never
//! panic. An input that panics is written to `fuzz/crashes/<target>-<hash>` and fails the
//! test, so it can be added to the corpus once fixed.
//!
//! `make test` runs 20,000 mutations per target; `GEOSTATE_FUZZ_RUNS=1000000 cargo test
//! --lib fuzz` runs longer, `GEOSTATE_FUZZ_SEED` another sequence. Not coverage-guided
//! (cargo-fuzz needs nightly and an instrumented build of RocksDB and librdkafka).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::checkpoint::parse_manifest;
use crate::checkpoint::savepoint::next_record;
use crate::clock::{Hlc, ManualClock};
use crate::config::{Config, RecordFormat};
use crate::crdt::{Delta, RegionId, ResumePoint, decode_value};
use crate::ingest::event::Update;
use crate::log::Record;
use crate::replication::Heartbeat;
use crate::replication::merger::merge_batch;
use crate::workload::Rng;

fn root() -> PathBuf {
    crate::repo_file("fuzz")
}

fn config() -> Config {
    Config::load(&crate::repo_file("regions/us-east-1.toml"))
        .unwrap_or_else(|e| panic!("the example config: {e}"))
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = root().join("corpus").join(target);
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    entries.sort();
    let mut out: Vec<Vec<u8>> = entries
        .iter()
        .filter_map(|p| std::fs::read(p).ok())
        .collect();
    out.push(Vec::new());
    out
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One mutation of `input`, with `other` (another corpus entry) for splices.
fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    const INTERESTING: [u8; 8] = [0x00, 0x01, 0x7f, 0x80, 0xff, b'"', b'{', b'-'];
    let mut out = input.to_vec();
    for _ in 0..=rng.below(4) {
        let len = out.len() as u64;
        let at = |rng: &mut Rng| rng.below(len.max(1)) as usize;
        match rng.below(8) {
            0 if !out.is_empty() => {
                let i = at(rng);
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = at(rng);
                out[i] = INTERESTING[rng.below(INTERESTING.len() as u64) as usize];
            }
            2 => {
                let i = rng.below(len + 1) as usize;
                let bytes: Vec<u8> = (0..=rng.below(8)).map(|_| rng.below(256) as u8).collect();
                out.splice(i..i, bytes);
            }
            3 if !out.is_empty() => {
                let i = at(rng);
                let end = (i + 1 + rng.below(16) as usize).min(out.len());
                out.drain(i..end);
            }
            4 if !out.is_empty() => {
                // repeat a slice: nested and repeated fields, long varints
                let i = at(rng);
                let end = (i + 1 + rng.below(32) as usize).min(out.len());
                let slice = out[i..end].to_vec();
                for _ in 0..=rng.below(64) {
                    out.splice(i..i, slice.iter().copied());
                }
            }
            5 => out.truncate(rng.below(len + 1) as usize),
            6 if !other.is_empty() => {
                let cut = rng.below(len + 1) as usize;
                let from = rng.below(other.len() as u64) as usize;
                out.truncate(cut);
                out.extend_from_slice(&other[from..]);
            }
            _ => {
                let i = at(rng);
                if let Some(b) = out.get_mut(i) {
                    *b = b.wrapping_add(rng.below(3) as u8).wrapping_sub(1);
                }
            }
        }
    }
    out
}

/// Runs `decode` on the corpus of `target` and on mutations of it; fails on a panic.
fn fuzz(target: &str, decode: impl Fn(&[u8])) {
    let corpus = corpus(target);
    let runs = env_u64("GEOSTATE_FUZZ_RUNS", 20_000);
    let mut rng = Rng(env_u64("GEOSTATE_FUZZ_SEED", 0x5eed_f022) | 1);
    let pick = |rng: &mut Rng| &corpus[rng.below(corpus.len() as u64) as usize];
    let inputs = corpus.iter().cloned().chain((0..runs).map(|_| {
        let (a, b) = (pick(&mut rng).clone(), pick(&mut rng).clone());
        mutate(&mut rng, &a, &b)
    }));
    for input in inputs {
        if catch_unwind(AssertUnwindSafe(|| decode(&input))).is_err() {
            let name = format!("{target}-{:016x}", fnv(&input));
            let path = root().join("crashes").join(name);
            let _ = std::fs::create_dir_all(root().join("crashes"));
            let _ = std::fs::write(&path, &input);
            panic!(
                "{target} panicked on {} bytes, written to {}",
                input.len(),
                path.display()
            );
        }
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Decoded and checked the way ingest takes a record of the updates topic.
fn update_records(target: &str, format: RecordFormat) {
    let config = config();
    fuzz(target, |bytes| {
        if let Ok(update) = Update::decode(format, bytes) {
            let _ = update.check(&config.namespaces, &config.ingest);
        }
    });
}

#[test]
fn update_records_json() {
    update_records("update-json", RecordFormat::Json);
}

#[test]
fn update_records_protobuf() {
    update_records("update-protobuf", RecordFormat::Protobuf);
}

/// Decoded and merged the way a remote's delta is, key and all.
#[test]
fn deltas() {
    let config = config();
    let remote = RegionId::new("eu-west-1").unwrap_or_else(|e| panic!("{e}"));
    let hlc = Hlc::new(
        Arc::new(ManualClock::new(1_800_000_000_000_000_000)),
        Duration::from_millis(500),
    );
    fuzz("delta", |bytes| {
        let key = Delta::decode(bytes).map(|d| d.key.into_bytes()).ok();
        let record = Record {
            partition: 0,
            offset: 1,
            timestamp_ms: None,
            key,
            payload: Some(bytes.to_vec()),
        };
        let stored = std::collections::BTreeMap::new();
        let _ = merge_batch(
            &[record],
            &stored,
            &remote,
            &config.namespaces,
            &config.ingest,
            &hlc,
        );
    });
}

#[test]
fn resume_points() {
    fuzz("resume-point", |bytes| {
        let _ = ResumePoint::decode(bytes);
    });
}

#[test]
fn heartbeats() {
    fuzz("heartbeat", |bytes| {
        let _ = Heartbeat::decode(bytes);
    });
}

#[test]
fn stored_values() {
    fuzz("state-value", |bytes| {
        let _ = decode_value(bytes);
    });
}

#[test]
fn savepoint_records() {
    fuzz("savepoint", |bytes| {
        let mut input = bytes;
        while let Ok(Some(_)) = next_record(&mut input) {}
    });
}

#[test]
fn manifests() {
    fuzz("manifest", |bytes| {
        let _ = parse_manifest("manifests/x.json", bytes);
    });
}

/// Writes the corpus: valid encodings of each kind (run once by hand, its output is
/// committed): `cargo test --lib fuzz::write_corpus -- --ignored`.
#[test]
#[ignore]
fn write_corpus() {
    use crate::clock::HlcTimestamp;
    use crate::crdt::{Actor, CrdtValue, GCounter, LwwRegister, OrderStamp, PnCounter};
    use crate::ingest::event::Op;

    let write = |target: &str, name: &str, bytes: &[u8]| {
        let dir = root().join("corpus").join(target);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.join(name), bytes).unwrap_or_else(|e| panic!("{e}"));
    };
    let region = |r: &str| RegionId::new(r).unwrap_or_else(|e| panic!("{e}"));
    let updates = [
        Update {
            key: "trips/9q8yy".into(),
            op: Op::Add(3),
            id: Some("evt-1".into()),
            event_time_ms: Some(1_700_000_000_000),
            hlc: None,
            epoch: None,
        },
        Update {
            key: "drivers/9q8yy".into(),
            op: Op::Add(-2),
            id: None,
            event_time_ms: None,
            hlc: None,
            epoch: None,
        },
        Update {
            key: "zones/9q8yy".into(),
            op: Op::Set(b"closed".to_vec()),
            id: None,
            event_time_ms: None,
            hlc: Some(HlcTimestamp::new(1_700_000_000_000_000_000, 2)),
            epoch: None,
        },
        Update {
            key: "surge/9q8yy".into(),
            op: Op::Cas {
                expected: Some(b"1.2".to_vec()),
                value: b"1.5".to_vec(),
            },
            id: Some("cas-1".into()),
            event_time_ms: None,
            hlc: Some(HlcTimestamp::new(1_700_000_000_000_000_001, 0)),
            epoch: Some(7),
        },
    ];
    for (i, u) in updates.iter().enumerate() {
        write(
            "update-json",
            &format!("{i}.json"),
            &u.encode(RecordFormat::Json),
        );
        write(
            "update-protobuf",
            &format!("{i}.pb"),
            &u.encode(RecordFormat::Protobuf),
        );
    }
    let eu = region("eu-west-1");
    let mut g = GCounter::new();
    g.increment(&Actor::new(eu.clone(), 3), 41)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut pn = PnCounter::new();
    pn.add(&Actor::new(eu.clone(), 3), -5)
        .unwrap_or_else(|e| panic!("{e}"));
    let reg = LwwRegister::new(
        b"1.8".to_vec(),
        OrderStamp {
            epoch: 4,
            hlc: HlcTimestamp::new(1_700_000_000_000_000_000, 1),
            origin: eu.clone(),
        },
    );
    let states = [
        ("trips/9q8yy", CrdtValue::GCounter(g)),
        ("drivers/9q8yy", CrdtValue::PnCounter(pn)),
        ("surge/9q8yy", CrdtValue::LwwRegister(reg)),
    ];
    for (i, (key, state)) in states.iter().enumerate() {
        let delta = Delta {
            key: (*key).into(),
            origin: eu.clone(),
            origin_time: HlcTimestamp::new(1_799_999_999_000_000_000, 0),
            epoch: state.epoch(),
            state: state.clone(),
            recent_ids: Vec::new(),
        };
        write("delta", &format!("{i}.pb"), &delta.encode());
        write(
            "state-value",
            &format!("{i}.pb"),
            &crate::crdt::encode_value(state),
        );
    }
    let resume = ResumePoint {
        origin: eu.clone(),
        incarnation: 1_796_000_000,
        updates_topic: "geostate.updates".into(),
        updates_offsets: [(0, 41), (3, 7)].into(),
        hlc_high_water: HlcTimestamp::new(1_700_000_000_000_000_000, 4),
        fences: [((5, 0), 9)].into(),
        watermarks: [(0, 1_700_000_000_000)].into(),
        outputs_through: Default::default(),
    };
    write("resume-point", "0.pb", &resume.encode());
    let beat = Heartbeat {
        origin: "eu-west-1".into(),
        wall_nanos: 1_700_000_000_000_000_000,
        watermark_ms: Some(1_700_000_000_000),
    };
    write("heartbeat", "0.bin", &beat.encode());
    let mut savepoint = Vec::new();
    let kinds = [
        crate::pb::savepoint_record::Kind::Header(crate::pb::SavepointHeader {
            format_version: 1,
            region: "us-east-1".into(),
            incarnation: 1_796_000_000,
            created_unix_ms: 1_796_000_000_000,
            writer_version: "0.1.0".into(),
            deltas_topic: "geostate.deltas".into(),
            deltas_next: [(0, 12)].into(),
        }),
        crate::pb::savepoint_record::Kind::Entry(crate::pb::SavepointEntry {
            column_family: "state".into(),
            key: b"surge/9q8yy".to_vec(),
            value: crate::crdt::encode_value(&states[2].1),
        }),
        crate::pb::savepoint_record::Kind::Footer(crate::pb::SavepointFooter { entries: 1 }),
    ];
    for kind in kinds {
        prost::Message::encode_length_delimited(
            &crate::pb::SavepointRecord { kind: Some(kind) },
            &mut savepoint,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
    write("savepoint", "0.gsp", &savepoint);
    let manifest = crate::checkpoint::Manifest {
        format_version: 1,
        id: "1796000000000".into(),
        region: "us-east-1".into(),
        incarnation: 1_796_000_000,
        created_unix_ms: 1_796_000_000_000,
        files: vec![crate::checkpoint::FileRef {
            name: "000012.sst".into(),
            object: "sst/1796000000/000012.sst".into(),
            bytes: 4096,
        }],
        offsets: [("geostate.updates".to_string(), [(0, 41)].into())].into(),
        hlc_high_water: Some(HlcTimestamp::new(1_700_000_000_000_000_000, 4)),
        deltas_topic: "geostate.deltas".into(),
        deltas_next: [(0, 12)].into(),
    };
    write(
        "manifest",
        "0.json",
        &serde_json::to_vec_pretty(&manifest).unwrap_or_else(|e| panic!("{e}")),
    );
}
