//! Savepoints: a self-contained, versioned logical dump of the store
//! (`proto/geostate/v1/savepoint.proto`): a header, every entry of every column family read
//! from one snapshot, a footer with the count. Independent of RocksDB's file format, so a
//! newer geostate restores it; used for upgrades and to rebuild a node.

use std::collections::BTreeMap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::Arc;

use prost::Message;

use super::objects::Objects;
use super::{CheckpointError, deltas_end_offsets, io, is_empty_dir, protocol, retrying, sibling};
use crate::clock::Clock;
use crate::config::Config;
use crate::log;
use crate::pb;
use crate::pb::savepoint_record::Kind;
use crate::store::Store;

/// The entry layout this version writes and the newest it restores.
pub const SAVEPOINT_VERSION: u32 = 1;
/// The column family a seed copies.
const STATE_FAMILY: &str = "state";
/// Entries written to RocksDB per batch during a restore.
const LOAD_BATCH: usize = 10_000;

/// A written savepoint.
#[derive(Clone, Debug)]
pub struct Written {
    pub id: String,
    pub location: String,
    pub entries: u64,
    pub bytes: u64,
}

fn bad(reason: impl Into<String>) -> CheckpointError {
    CheckpointError::Savepoint(reason.into())
}

/// Dumps the store and uploads it as `savepoints/<id>.gsp`, named by `wall`'s time.
pub async fn write(
    config: &Config,
    store: &Arc<Store>,
    objects: &Objects,
    incarnation: u32,
    wall: &dyn Clock,
) -> Result<Written, CheckpointError> {
    let unix_ms = wall.now_nanos() / 1_000_000;
    let id = protocol::id_at(unix_ms);
    let deltas_topic = config.kafka.deltas_topic.clone();
    let deltas_next = deltas_end_offsets(config).await;
    let header = pb::SavepointHeader {
        format_version: SAVEPOINT_VERSION,
        region: config.region.to_string(),
        incarnation,
        created_unix_ms: unix_ms,
        writer_version: env!("CARGO_PKG_VERSION").into(),
        deltas_topic,
        deltas_next: deltas_next.into_iter().collect(),
    };
    let path = sibling(&config.data_dir, &format!("savepoint-{id}.gsp"));
    let (store, file) = (store.clone(), path.clone());
    let entries = tokio::task::spawn_blocking(move || dump(&store, header, &file))
        .await
        .map_err(|e| CheckpointError::Task(e.to_string()))?;
    let result = async {
        let entries = entries?;
        let bytes = tokio::fs::metadata(&path)
            .await
            .map_err(io("reading the savepoint"))?
            .len();
        let key = protocol::savepoint_key(&id);
        retrying("savepoint upload", || objects.put_file(&key, &path)).await?;
        Ok(Written {
            location: objects.describe(&key),
            id,
            entries,
            bytes,
        })
    }
    .await;
    let _ = tokio::fs::remove_file(&path).await;
    result
}

fn dump(store: &Store, header: pb::SavepointHeader, path: &Path) -> Result<u64, CheckpointError> {
    let file = std::fs::File::create(path).map_err(io("writing the savepoint"))?;
    let mut out = BufWriter::new(file);
    let mut buf = Vec::new();
    let mut put = |kind: Kind| -> Result<(), CheckpointError> {
        buf.clear();
        pb::SavepointRecord { kind: Some(kind) }
            .encode_length_delimited(&mut buf)
            .map_err(|e| bad(e.to_string()))?;
        out.write_all(&buf).map_err(io("writing the savepoint"))
    };
    put(Kind::Header(header))?;
    let entries = store.for_each_entry(|cf, key, value| {
        put(Kind::Entry(pb::SavepointEntry {
            column_family: cf.to_owned(),
            key: key.to_vec(),
            value: value.to_vec(),
        }))
    })?;
    put(Kind::Footer(pb::SavepointFooter { entries }))?;
    let file = out
        .into_inner()
        .map_err(|e| io("writing the savepoint")(e.into_error()))?;
    file.sync_all().map_err(io("writing the savepoint"))?;
    Ok(entries)
}

/// Restores a savepoint — an id in the store, or the path of a `.gsp` file — into the
/// empty data dir, and marks the store to bootstrap from its own deltas topic on start.
///
/// A savepoint of this region is restored whole. With `seed`, a savepoint of another
/// region seeds this one: only the state is loaded (every region's parts as the other
/// region knew them), none of its positions, idempotency windows or outbox, and this
/// region then reads its own topics from the start under a new incarnation.
pub async fn restore(
    config: &Config,
    objects: &Objects,
    savepoint: &str,
    seed: bool,
) -> Result<pb::SavepointHeader, CheckpointError> {
    let data_dir = config.data_dir.clone();
    if !is_empty_dir(&data_dir)? {
        return Err(CheckpointError::NotEmpty(data_dir.display().to_string()));
    }
    let local = Path::new(savepoint);
    let (file, downloaded) = if local.is_file() {
        (local.to_owned(), false)
    } else {
        let path = sibling(&data_dir, "savepoint-download.gsp");
        objects
            .get_to_file(&protocol::savepoint_key(savepoint), &path)
            .await?;
        (path, true)
    };
    let tmp = sibling(&data_dir, "restore");
    let _ = tokio::fs::remove_dir_all(&tmp).await;
    let (source, target) = (file.clone(), tmp.clone());
    let region = config.region.to_string();
    // each key loads into its partition of this region's count
    let partitions = log::partitions(&config.kafka, &config.kafka.updates_topic)
        .await?
        .len();
    let loaded =
        tokio::task::spawn_blocking(move || load(&source, &target, &region, seed, partitions))
            .await
            .map_err(|e| CheckpointError::Task(e.to_string()));
    if downloaded {
        let _ = tokio::fs::remove_file(&file).await;
    }
    let header = match loaded.and_then(|r| r) {
        Ok(header) => header,
        Err(e) => {
            let _ = tokio::fs::remove_dir_all(&tmp).await;
            return Err(e);
        }
    };
    let _ = tokio::fs::remove_dir(&data_dir).await;
    tokio::fs::rename(&tmp, &data_dir)
        .await
        .map_err(io(format!(
            "moving the restored store to {}",
            data_dir.display()
        )))?;
    let (dir, topic, next, from) = (
        data_dir,
        header.deltas_topic.clone(),
        header
            .deltas_next
            .clone()
            .into_iter()
            .collect::<BTreeMap<_, _>>(),
        format!("savepoint {savepoint}"),
    );
    tokio::task::spawn_blocking(move || {
        Store::open_existing(&dir)?.prepare_bootstrap(&topic, &next, &from, false)
    })
    .await
    .map_err(|e| CheckpointError::Task(e.to_string()))??;
    Ok(header)
}

/// The next record of a savepoint (`None`: the input ended between records). A length
/// prefix larger than what follows is an error once the input ends, never an allocation.
pub fn next_record(input: &mut impl Read) -> Result<Option<Kind>, CheckpointError> {
    let mut first = [0u8; 1];
    if input
        .read(&mut first)
        .map_err(io("reading the savepoint"))?
        == 0
    {
        return Ok(None);
    }
    // the varint length prefix, one byte at a time
    let mut len: u64 = u64::from(first[0] & 0x7f);
    let mut shift = 7;
    let mut byte = first[0];
    while byte & 0x80 != 0 {
        let mut b = [0u8; 1];
        input
            .read_exact(&mut b)
            .map_err(io("reading the savepoint"))?;
        byte = b[0];
        len |= u64::from(byte & 0x7f) << shift;
        shift += 7;
        if shift > 63 {
            return Err(bad("a record length is corrupt"));
        }
    }
    // read what is there, never allocate what the (maybe corrupt) length claims
    let mut buf = Vec::new();
    input
        .by_ref()
        .take(len)
        .read_to_end(&mut buf)
        .map_err(io("reading the savepoint"))?;
    if buf.len() as u64 != len {
        return Err(bad("the file ends inside a record (truncated?)"));
    }
    let record = pb::SavepointRecord::decode(buf.as_slice()).map_err(|e| bad(e.to_string()))?;
    record
        .kind
        .map(Some)
        .ok_or_else(|| bad("a record has no content"))
}

fn load(
    path: &Path,
    dir: &Path,
    region: &str,
    seed: bool,
    partitions: usize,
) -> Result<pb::SavepointHeader, CheckpointError> {
    let file = std::fs::File::open(path).map_err(io(format!("reading {}", path.display())))?;
    let mut input = BufReader::new(file);
    let mut next = || next_record(&mut input);
    let header = match next()? {
        Some(Kind::Header(h)) => h,
        _ => return Err(bad("the file does not start with a savepoint header")),
    };
    if header.format_version > SAVEPOINT_VERSION {
        return Err(CheckpointError::Newer {
            what: "savepoint".into(),
            found: header.format_version,
            supported: SAVEPOINT_VERSION,
        });
    }
    if !seed && header.region != region {
        return Err(bad(format!(
            "it was written by region {}, this node is {region}: restore it here with --seed (state only), or on a {} node",
            header.region, header.region
        )));
    }
    let store = Store::open(dir, partitions)?;
    let (mut batch, mut count) = (Vec::with_capacity(LOAD_BATCH), 0u64);
    loop {
        match next()? {
            Some(Kind::Entry(e)) => {
                count += 1;
                if seed && e.column_family != STATE_FAMILY {
                    continue;
                }
                batch.push((e.column_family, e.key, e.value));
                if batch.len() >= LOAD_BATCH {
                    store.load(&batch)?;
                    batch.clear();
                }
            }
            Some(Kind::Footer(f)) => {
                if f.entries != count {
                    return Err(bad(format!(
                        "the footer counts {} entries, the file holds {count}",
                        f.entries
                    )));
                }
                store.load(&batch)?;
                return Ok(header);
            }
            Some(Kind::Header(_)) => return Err(bad("a second header")),
            None => return Err(bad("the file ends without a footer (truncated?)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record length no file holds (a corrupt varint of about 2^62) is an error, never
    /// an allocation of that size (which aborted the process).
    #[test]
    fn a_corrupt_record_length_is_refused_without_allocating_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("corrupt.gsp");
        let mut bytes = vec![0xff; 8];
        bytes.extend_from_slice(&[0x3f, b'a', b'b', b'c']);
        std::fs::write(&path, bytes).unwrap();
        let err = load(&path, &dir.path().join("data"), "us-east-1", false, 4)
            .expect_err("a corrupt savepoint");
        assert!(err.to_string().contains("truncated"), "{err}");
    }
}
