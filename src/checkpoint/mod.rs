//! Incremental checkpoints of the store to object storage, restore, and savepoints. The
//! decisions (object keys, what to upload, what retention deletes) are pure, in
//! `protocol.rs`; this file and `savepoint.rs` carry them out against `objects.rs`.
//!
//! ```text
//!  every interval (or Admin/Checkpoint):
//!    deltas topic end offsets ──► RocksDB checkpoint (flush + hard links), every stored
//!    offset and the clock high-water read from the copy ──► upload SSTs not uploaded
//!    before (sst/<incarnation>/<file>), the small files (files/<id>/…), paced
//!    ──► manifests/<id>.json LAST (the commit point) ──► retention: newest `keep`
//!    manifests, delete every object none of them references
//!  restore: manifest ──► download its files ──► open ──► mark for bootstrap
//! ```
//!
//! Guarantees: a checkpoint exists only once its manifest is written, and the manifest is
//! written after every file it names, so a failure anywhere (the server stopped mid-upload)
//! leaves the newest good checkpoint untouched; files are deleted only when no kept manifest
//! references them. SST file numbers never repeat within a RocksDB lineage, and a restored
//! or rebuilt node takes a new incarnation, so `sst/<incarnation>/<file>` names one content
//! forever. A restored store replays from the offsets inside it (they were written with the
//! state), and first merges its own deltas topic from where the copy was taken, so what the
//! lost node shipped after the copy is kept, never applied twice (see `replication::
//! bootstrap`).

pub mod objects;
pub mod protocol;
pub mod savepoint;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};

use crate::clock::{Clock, HlcTimestamp};
use crate::config::Config;
use crate::log;
use crate::metrics as m;
use crate::partition::Partitions;
use crate::shutdown::stopped;
use crate::store::{Store, StoreError};
use objects::{ObjectError, Objects};
use protocol::Upload;

/// The manifest layout this version writes and the only one it restores (2: a store of
/// one RocksDB per partition, files named `p<partition>/<file>`).
pub const FORMAT_VERSION: u32 = 2;
/// Attempts per object upload before the checkpoint fails.
const UPLOAD_ATTEMPTS: u32 = 5;
/// Parallel downloads during a restore.
const RESTORE_PARALLEL: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(
        "this node does not own partition 0: a region's checkpoints are taken by the node owning it (Admin/Route names it for any key of that partition)"
    )]
    NotTaker,
    #[error(transparent)]
    Objects(#[from] ObjectError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("manifest {key} is unreadable: {reason}")]
    Manifest { key: String, reason: String },
    #[error("no checkpoint in {0}")]
    NoCheckpoint(String),
    #[error("data dir {0} is not empty: restore only into an empty or missing data dir")]
    NotEmpty(String),
    #[error("{what} has format version {found}; this geostate reads up to {supported}")]
    Newer {
        what: String,
        found: u32,
        supported: u32,
    },
    #[error("{what} has {found} bytes, the manifest says {expected}")]
    Size {
        what: String,
        found: u64,
        expected: u64,
    },
    #[error("savepoint: {0}")]
    Savepoint(String),
    #[error("task failed: {0}")]
    Task(String),
    #[error(
        "{what} has format version {found}, one RocksDB for every partition; this geostate restores version {FORMAT_VERSION} (one per partition): restore a savepoint taken with the older version"
    )]
    Older { what: String, found: u32 },
    #[error("reading the updates topic's partitions: {0}")]
    Log(#[from] log::LogError),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let what = what.into();
    move |source| CheckpointError::Io { what, source }
}

/// The commit point of a checkpoint (`manifests/<id>.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub id: String,
    pub region: String,
    pub incarnation: u32,
    pub created_unix_ms: u64,
    pub files: Vec<FileRef>,
    /// Every stored position: the updates topic's and each remote's, per partition the
    /// last applied offset (the same values are inside the copy).
    pub offsets: BTreeMap<String, BTreeMap<i32, i64>>,
    pub hlc_high_water: Option<HlcTimestamp>,
    pub deltas_topic: String,
    /// The deltas topic's end offsets taken before the copy.
    pub deltas_next: BTreeMap<i32, i64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    /// File name inside the RocksDB directory.
    pub name: String,
    /// Object key, relative to the store's prefix.
    pub object: String,
    pub bytes: u64,
}

/// One finished checkpoint.
#[derive(Clone, Debug)]
pub struct Taken {
    pub id: String,
    pub manifest: String,
    /// When it was taken, on the node's wall clock.
    pub unix_ms: u64,
    pub duration: Duration,
    pub files: usize,
    pub bytes_total: u64,
    pub bytes_uploaded: u64,
}

/// What `Admin/Status` shows about checkpoints.
#[derive(Debug, Default)]
pub struct CheckpointStatus {
    pub last: Mutex<Option<Taken>>,
    pub taken: AtomicU64,
    pub failures: AtomicU64,
    /// Set once at start: what the store was restored from.
    pub restored_from: Option<String>,
    pub target: String,
}

/// A request to checkpoint now; answered with the result.
pub type Request = oneshot::Sender<Result<Taken, CheckpointError>>;

pub struct Checkpointer {
    pub config: Arc<Config>,
    pub store: Arc<Store>,
    pub objects: Objects,
    pub incarnation: u32,
    /// Names checkpoints by the time they are taken.
    pub wall: Arc<dyn Clock>,
    pub status: Arc<CheckpointStatus>,
    pub requests: mpsc::Receiver<Request>,
    /// The partitions this node owns: only the owner of partition 0 checkpoints, so a
    /// region's nodes never race on one prefix (each checkpoint holds the node's copy of
    /// every partition; a restore catches each one up from the deltas topic).
    pub owned: Arc<Partitions>,
}

impl Checkpointer {
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let interval = self.config.checkpoint.interval;
        let mut next = tokio::time::Instant::now() + interval;
        loop {
            let reply = tokio::select! {
                () = stopped(&mut stop) => return,
                request = self.requests.recv() => match request {
                    Some(reply) => Some(reply),
                    None => return,
                },
                () = tokio::time::sleep_until(next), if !interval.is_zero() => None,
            };
            let taker = self.owned.owns(0);
            if !taker {
                if let Some(reply) = reply {
                    let _ = reply.send(Err(CheckpointError::NotTaker));
                }
                next = tokio::time::Instant::now() + interval;
                continue;
            }
            // SST objects in the store now: never uploaded twice, and never named by a
            // manifest once gone. Listed before every checkpoint: while another node of
            // the region owned partition 0, its retention deleted what its own
            // manifests did not name.
            let mut uploaded: BTreeSet<String> = match self.objects.list(protocol::SSTS).await {
                Ok(keys) => keys.into_iter().collect(),
                Err(e) => {
                    tracing::warn!(error = %e, "listing uploaded checkpoint files failed; uploading every file");
                    BTreeSet::new()
                }
            };
            let result = self.take(&mut uploaded).await;
            match &result {
                Ok(taken) => {
                    self.status.taken.fetch_add(1, Ordering::Relaxed);
                    *self.status.last.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(taken.clone());
                    metrics::counter!(m::CHECKPOINTS).increment(1);
                    metrics::histogram!(m::CHECKPOINT_SECONDS).record(taken.duration.as_secs_f64());
                    metrics::counter!(m::CHECKPOINT_BYTES_UPLOADED).increment(taken.bytes_uploaded);
                    metrics::gauge!(m::CHECKPOINT_LAST).set(taken.unix_ms as f64 / 1e3);
                    tracing::info!(id = %taken.id, files = taken.files, uploaded = taken.bytes_uploaded, total = taken.bytes_total, took = ?taken.duration, "checkpoint written");
                }
                Err(e) => {
                    self.status.failures.fetch_add(1, Ordering::Relaxed);
                    metrics::counter!(m::CHECKPOINT_FAILURES).increment(1);
                    tracing::warn!(error = %e, "checkpoint failed; the previous one stays the newest");
                }
            }
            if let Some(reply) = reply {
                let _ = reply.send(result);
            }
            next = tokio::time::Instant::now() + interval;
        }
    }

    async fn take(&self, uploaded: &mut BTreeSet<String>) -> Result<Taken, CheckpointError> {
        let started = Instant::now();
        let unix_ms = self.wall.now_nanos() / 1_000_000;
        let id = protocol::id_at(unix_ms);
        // before the copy: every delta before these offsets is covered by it
        let deltas_next = deltas_end_offsets(&self.config).await;
        let tmp = sibling(&self.config.data_dir, &format!("checkpoint-{id}"));
        let _ = tokio::fs::remove_dir_all(&tmp).await;
        let result = self
            .copy_and_upload(&id, unix_ms, &tmp, deltas_next, uploaded)
            .await;
        let _ = tokio::fs::remove_dir_all(&tmp).await;
        let (manifest, upload) = result?;
        if let Err(e) = retain(&self.objects, self.config.checkpoint.keep, uploaded).await {
            tracing::warn!(error = %e, "deleting old checkpoints failed; retried after the next one");
        }
        Ok(Taken {
            manifest: self.objects.describe(&protocol::manifest_key(&id)),
            id,
            unix_ms,
            duration: started.elapsed(),
            files: manifest.files.len(),
            bytes_total: upload.bytes_total(),
            bytes_uploaded: upload.bytes_uploaded(),
        })
    }

    /// Copies the store into `tmp`, uploads what the plan names, then the manifest.
    async fn copy_and_upload(
        &self,
        id: &str,
        unix_ms: u64,
        tmp: &Path,
        deltas_next: BTreeMap<i32, i64>,
        uploaded: &mut BTreeSet<String>,
    ) -> Result<(Manifest, Upload), CheckpointError> {
        // the copy is one point in time; the positions are read from the copy itself, so
        // they match it without pausing ingest
        let (store, dir) = (self.store.clone(), tmp.to_owned());
        let (offsets, hlc_high_water) = tokio::task::spawn_blocking(move || {
            store.checkpoint_to(&dir)?;
            let copy = Store::open_read_only(&dir)?;
            Ok::<_, StoreError>((copy.all_offsets()?, copy.hlc_high_water()?))
        })
        .await
        .map_err(|e| CheckpointError::Task(e.to_string()))??;
        let plan = protocol::plan_upload(id, self.incarnation, files_in(tmp).await?, uploaded);
        let mut pace = Pace::new(self.config.checkpoint.upload_bytes_per_second);
        for file in &plan.upload {
            let path = tmp.join(&file.name);
            retrying("checkpoint upload", || {
                self.objects.put_file(&file.object, &path)
            })
            .await?;
            pace.sent(file.bytes).await;
            if file.object.starts_with(protocol::SSTS) {
                uploaded.insert(file.object.clone());
            }
        }
        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            id: id.to_owned(),
            region: self.config.region.to_string(),
            incarnation: self.incarnation,
            created_unix_ms: unix_ms,
            files: plan.files.clone(),
            offsets,
            hlc_high_water,
            deltas_topic: self.config.kafka.deltas_topic.clone(),
            deltas_next,
        };
        let key = protocol::manifest_key(id);
        let json = serde_json::to_vec_pretty(&manifest).map_err(|e| CheckpointError::Manifest {
            key: key.clone(),
            reason: e.to_string(),
        })?;
        retrying("writing the manifest", || {
            self.objects.put_bytes(&key, json.clone())
        })
        .await?;
        Ok((manifest, plan))
    }
}

/// The files of a store's copy (`p<partition>/<file>`, bytes).
async fn files_in(dir: &Path) -> Result<Vec<(String, u64)>, CheckpointError> {
    let mut files = Vec::new();
    for (name, is_dir) in entries_of(dir).await? {
        if is_dir {
            for (file, is_dir) in entries_of(&dir.join(&name)).await? {
                if !is_dir {
                    let bytes = tokio::fs::metadata(dir.join(&name).join(&file))
                        .await
                        .map_err(io("reading the checkpoint"))?
                        .len();
                    files.push((format!("{name}/{file}"), bytes));
                }
            }
        }
    }
    Ok(files)
}

/// The names in a directory, each with whether it is a directory.
async fn entries_of(dir: &Path) -> Result<Vec<(String, bool)>, CheckpointError> {
    let mut out = Vec::new();
    let mut entries = tokio::fs::read_dir(dir)
        .await
        .map_err(io("reading the checkpoint"))?;
    while let Some(entry) = entries
        .next_entry()
        .await
        .map_err(io("reading the checkpoint"))?
    {
        let kind = entry
            .file_type()
            .await
            .map_err(io("reading the checkpoint"))?;
        out.push((
            entry.file_name().to_string_lossy().into_owned(),
            kind.is_dir(),
        ));
    }
    Ok(out)
}

/// Keeps the newest `keep` manifests and deletes every file none of them references
/// (`protocol::split_manifests`, `protocol::unreferenced`).
async fn retain(
    objects: &Objects,
    keep: usize,
    uploaded: &mut BTreeSet<String>,
) -> Result<(), CheckpointError> {
    let (old, kept) = protocol::split_manifests(objects.list(protocol::MANIFESTS).await?, keep);
    for key in old {
        objects.delete(&key).await?;
    }
    let mut referenced = BTreeSet::new();
    for key in kept {
        let manifest = read_manifest(objects, &key).await?;
        referenced.extend(manifest.files.into_iter().map(|f| f.object));
    }
    let stored = objects
        .list(protocol::SSTS)
        .await?
        .into_iter()
        .chain(objects.list(protocol::FILES).await?);
    for key in protocol::unreferenced(&referenced, stored) {
        objects.delete(&key).await?;
    }
    uploaded.retain(|k| referenced.contains(k));
    Ok(())
}

/// The deltas topic's end offsets, taken before a copy (empty if unknown: a restore then
/// reads the topic from the start).
pub(crate) async fn deltas_end_offsets(config: &Config) -> BTreeMap<i32, i64> {
    let topic = &config.kafka.deltas_topic;
    match log::partitions(&config.kafka, topic).await {
        Ok(partitions) => log::end_offsets(&config.kafka, topic, partitions)
            .await
            .unwrap_or_default(),
        Err(e) => {
            tracing::warn!(error = %e, "deltas topic end offsets unknown; a restore will read it from the start");
            BTreeMap::new()
        }
    }
}

/// Runs one object operation until it succeeds, up to `UPLOAD_ATTEMPTS` times with
/// exponential backoff in between; the checkpoint fails with its last error.
async fn retrying<F, Fut>(what: &str, mut op: F) -> Result<(), ObjectError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), ObjectError>>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        match op().await {
            Ok(()) => return Ok(()),
            Err(e) if attempt >= UPLOAD_ATTEMPTS => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, attempt, "{what} failed; retrying");
                tokio::time::sleep(Duration::from_millis(100 << attempt.min(6))).await;
            }
        }
    }
}

/// Paces uploads to a byte rate, at file granularity.
struct Pace {
    rate: u64,
    started: Instant,
    sent: u64,
}

impl Pace {
    fn new(rate: u64) -> Self {
        Self {
            rate,
            started: Instant::now(),
            sent: 0,
        }
    }

    async fn sent(&mut self, bytes: u64) {
        if self.rate == 0 {
            return;
        }
        self.sent += bytes;
        let due = Duration::from_secs_f64(self.sent as f64 / self.rate as f64);
        if let Some(wait) = due.checked_sub(self.started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
}

/// `<data-dir>.<suffix>`: next to the data dir, on the same file system (hard links).
fn sibling(data_dir: &Path, suffix: &str) -> PathBuf {
    let mut name = data_dir.as_os_str().to_owned();
    name.push(format!(".{suffix}"));
    PathBuf::from(name)
}

async fn read_manifest(objects: &Objects, key: &str) -> Result<Manifest, CheckpointError> {
    parse_manifest(key, &objects.get_bytes(key).await?)
}

/// A manifest from the bytes of the object `key`, checked: a version this build reads,
/// and file names that stay inside the directory they are restored into.
pub fn parse_manifest(key: &str, bytes: &[u8]) -> Result<Manifest, CheckpointError> {
    let manifest: Manifest =
        serde_json::from_slice(bytes).map_err(|e| CheckpointError::Manifest {
            key: key.to_owned(),
            reason: e.to_string(),
        })?;
    let what = format!("checkpoint {}", manifest.id);
    let found = manifest.format_version;
    if found > FORMAT_VERSION {
        return Err(CheckpointError::Newer {
            what,
            found,
            supported: FORMAT_VERSION,
        });
    }
    if found < FORMAT_VERSION {
        return Err(CheckpointError::Older { what, found });
    }
    // restore writes each file under its name into the restore dir: a name that is any
    // other path (`../x`, `/etc/x`) would write outside it
    if let Some(file) = manifest.files.iter().find(|f| !is_partition_file(&f.name)) {
        return Err(CheckpointError::Manifest {
            key: key.to_owned(),
            reason: format!(
                "file name {:?} is not p<partition>/<a plain file name>",
                file.name
            ),
        });
    }
    Ok(manifest)
}

/// `p<partition>/<file>`, where file is a name RocksDB gives a file of its directory: no
/// separator, not `.` or `..`, not empty.
fn is_partition_file(name: &str) -> bool {
    let Some((dir, file)) = name.split_once('/') else {
        return false;
    };
    let partition = dir
        .strip_prefix('p')
        .is_some_and(|p| p.parse::<u16>().is_ok());
    partition
        && !file.is_empty()
        && file != "."
        && file != ".."
        && !file.contains(['/', '\\', '\0'])
}

/// The ids of every checkpoint in the store, oldest first.
pub async fn list(objects: &Objects) -> Result<Vec<String>, CheckpointError> {
    Ok(objects
        .list(protocol::MANIFESTS)
        .await?
        .iter()
        .filter_map(|k| protocol::manifest_id(k).map(str::to_owned))
        .collect())
}

/// True if `dir` is missing or holds nothing.
pub fn is_empty_dir(dir: &Path) -> Result<bool, CheckpointError> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(io(format!("reading {}", dir.display()))(e)),
    }
}

/// Restores checkpoint `id` (default: the newest) into the empty data dir, and marks the
/// store to bootstrap from its own deltas topic on start. With `partition`, restores only
/// that partition's instance, into a data dir that lost it: the other partitions keep
/// their own (newer) state, and bootstrap merges only what the region shipped for the
/// restored one since the copy.
pub async fn restore(
    config: &Config,
    objects: &Objects,
    id: Option<&str>,
    partition: Option<usize>,
) -> Result<Manifest, CheckpointError> {
    let data_dir = &config.data_dir;
    let into = match partition {
        None => data_dir.clone(),
        Some(p) => crate::store::partition_dir(data_dir, p),
    };
    if !is_empty_dir(&into)? {
        return Err(CheckpointError::NotEmpty(into.display().to_string()));
    }
    let id = match id {
        Some(id) => id.to_owned(),
        None => list(objects)
            .await?
            .pop()
            .ok_or_else(|| CheckpointError::NoCheckpoint(objects.describe(protocol::MANIFESTS)))?,
    };
    let key = protocol::manifest_key(&id);
    let manifest = read_manifest(objects, &key).await?;
    let only = partition.map(|p| format!("p{p}/"));
    let files: Vec<FileRef> = manifest
        .files
        .iter()
        .filter(|f| only.as_ref().is_none_or(|o| f.name.starts_with(o)))
        .cloned()
        .collect();
    if files.is_empty() {
        let reason = format!("no files of {}", only.as_deref().unwrap_or("any partition"));
        return Err(CheckpointError::Manifest { key, reason });
    }
    let tmp = sibling(data_dir, "restore");
    let _ = tokio::fs::remove_dir_all(&tmp).await;
    download(objects, &files, &tmp).await?;
    let copy = match partition {
        None => tmp.clone(),
        Some(p) => crate::store::partition_dir(&tmp, p),
    };
    let _ = tokio::fs::remove_dir(&into).await;
    tokio::fs::rename(&copy, &into).await.map_err(io(format!(
        "moving the restored copy to {}",
        into.display()
    )))?;
    let _ = tokio::fs::remove_dir_all(&tmp).await;
    // where each partition's own deltas are merged from: the restored ones where the copy
    // was taken, the others (newer than any delta they shipped) from the topic's end
    let mut deltas_next = manifest.deltas_next.clone();
    let mut from = format!("checkpoint {}", manifest.id);
    if let Some(p) = partition {
        let p = p as i32;
        let own = deltas_next.get(&p).copied();
        deltas_next = deltas_end_offsets(config).await;
        deltas_next.remove(&p);
        deltas_next.extend(own.map(|next| (p, next)));
        from = format!("{from} (partition {p})");
    }
    let (dir, topic) = (data_dir.clone(), manifest.deltas_topic.clone());
    tokio::task::spawn_blocking(move || {
        Store::open_existing(&dir)?.prepare_bootstrap(&topic, &deltas_next, &from, true)
    })
    .await
    .map_err(|e| CheckpointError::Task(e.to_string()))??;
    Ok(manifest)
}

/// Downloads `files` into `dir` (each under its name), a few at a time, checking sizes.
async fn download(objects: &Objects, files: &[FileRef], dir: &Path) -> Result<(), CheckpointError> {
    let mut downloads = tokio::task::JoinSet::new();
    for file in files.iter().cloned() {
        if downloads.len() >= RESTORE_PARALLEL
            && let Some(done) = downloads.join_next().await
        {
            done.map_err(|e| CheckpointError::Task(e.to_string()))??;
        }
        let (objects, path) = (objects.clone(), dir.join(&file.name));
        if let Some(parent) = path.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(io(format!("creating {}", parent.display())))?;
        }
        downloads.spawn(async move {
            let found = objects.get_to_file(&file.object, &path).await?;
            if found != file.bytes {
                return Err(CheckpointError::Size {
                    what: file.object,
                    found,
                    expected: file.bytes,
                });
            }
            Ok(())
        });
    }
    while let Some(done) = downloads.join_next().await {
        done.map_err(|e| CheckpointError::Task(e.to_string()))??;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(id: &str, objects: &[&str]) -> Vec<u8> {
        let files = objects
            .iter()
            .map(|object| FileRef {
                name: format!("p0/{}", object.rsplit('/').next().unwrap_or_default()),
                object: (*object).to_owned(),
                bytes: 1,
            })
            .collect();
        serde_json::to_vec(&Manifest {
            format_version: FORMAT_VERSION,
            id: id.to_owned(),
            region: "us-east-1".into(),
            incarnation: 1,
            created_unix_ms: 0,
            files,
            offsets: BTreeMap::new(),
            hlc_high_water: None,
            deltas_topic: "geostate.deltas".into(),
            deltas_next: BTreeMap::new(),
        })
        .unwrap()
    }

    /// Retention runs the protocol's plan against a real object store (a folder): the
    /// newest manifests and every object they name stay, everything else goes.
    #[tokio::test]
    async fn retention_deletes_old_manifests_and_only_the_files_no_kept_one_names() {
        let dir = tempfile::tempdir().unwrap();
        let objects = Objects::Local(dir.path().to_owned());
        let put = |key: &'static str, bytes: Vec<u8>| objects.put_bytes(key, bytes);
        put(
            "manifests/1.json",
            manifest("1", &["sst/1/a.sst", "files/1/CURRENT"]),
        )
        .await
        .unwrap();
        put(
            "manifests/2.json",
            manifest("2", &["sst/1/a.sst", "sst/1/b.sst", "files/2/CURRENT"]),
        )
        .await
        .unwrap();
        put(
            "manifests/3.json",
            manifest("3", &["sst/1/b.sst", "files/3/CURRENT"]),
        )
        .await
        .unwrap();
        for key in [
            "sst/1/a.sst",
            "sst/1/b.sst",
            "files/1/CURRENT",
            "files/2/CURRENT",
            "files/3/CURRENT",
        ] {
            put(key, vec![0]).await.unwrap();
        }
        let mut uploaded = BTreeSet::from(["sst/1/a.sst".to_string(), "sst/1/b.sst".to_string()]);
        retain(&objects, 2, &mut uploaded).await.unwrap();
        let mut left = objects.list("").await.unwrap();
        left.sort();
        assert_eq!(
            left,
            [
                "files/2/CURRENT",
                "files/3/CURRENT",
                "manifests/2.json",
                "manifests/3.json",
                "sst/1/a.sst",
                "sst/1/b.sst"
            ]
        );
        retain(&objects, 1, &mut uploaded).await.unwrap();
        let mut left = objects.list("").await.unwrap();
        left.sort();
        assert_eq!(left, ["files/3/CURRENT", "manifests/3.json", "sst/1/b.sst"]);
        assert_eq!(uploaded, BTreeSet::from(["sst/1/b.sst".to_string()]));
    }

    #[test]
    fn only_files_of_a_partitions_directory_are_restored() {
        for ok in [
            "p0/000012.sst",
            "p3/MANIFEST-000005",
            "p11/CURRENT",
            "p0/OPTIONS-000007",
            "p0/..x",
        ] {
            assert!(is_partition_file(ok), "{ok}");
        }
        for bad in [
            "",
            "000012.sst",
            "p0/",
            "p0/.",
            "p0/..",
            "p0/../x",
            "px/a",
            "p0/a/b",
            "../p0/x",
            "/p0/x",
            "p0/a\\b",
            "p0/x\0",
        ] {
            assert!(!is_partition_file(bad), "{bad:?}");
        }
    }
}
