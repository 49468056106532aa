//! PURE: the checkpoint protocol's decisions, with I/O kept at the edge (`mod.rs`,
//! `savepoint.rs`): the only place object keys are formatted, which files of a copy are
//! uploaded, and which objects retention deletes. Nothing here reads a clock or touches
//! storage.
//!
//! ```text
//!  <prefix>/manifests/<id>.json        a checkpoint (the commit point), id = unix ms, 13 digits
//!  <prefix>/sst/<incarnation>/p<partition>/<file>
//!                                      an SST, shared by every checkpoint that names it
//!  <prefix>/files/<id>/p<partition>/<file>
//!                                      the other files of one checkpoint
//!  <prefix>/savepoints/<id>.gsp        a savepoint
//! ```

use std::collections::BTreeSet;

use super::FileRef;

pub const MANIFESTS: &str = "manifests/";
pub const SSTS: &str = "sst/";
pub const FILES: &str = "files/";
pub const SAVEPOINTS: &str = "savepoints/";

/// The id of a checkpoint or savepoint taken at `unix_ms`: sorts as it was taken.
pub fn id_at(unix_ms: u64) -> String {
    format!("{unix_ms:013}")
}

pub fn manifest_key(id: &str) -> String {
    format!("{MANIFESTS}{id}.json")
}

/// The checkpoint id a manifest key names.
pub fn manifest_id(key: &str) -> Option<&str> {
    key.strip_prefix(MANIFESTS)?.strip_suffix(".json")
}

pub fn savepoint_key(id: &str) -> String {
    format!("{SAVEPOINTS}{id}.gsp")
}

/// Where checkpoint `id` of incarnation `incarnation` keeps the copy's file `name`: SSTs
/// never change once written, so they are shared across checkpoints of one incarnation.
pub fn object_of(id: &str, incarnation: u32, name: &str) -> String {
    if is_sst(name) {
        format!("{SSTS}{incarnation}/{name}")
    } else {
        format!("{FILES}{id}/{name}")
    }
}

fn is_sst(name: &str) -> bool {
    name.ends_with(".sst")
}

/// Whether a file of the copied RocksDB directory belongs in the checkpoint: `LOG*` files
/// are RocksDB's own text log (opening the copy may write one).
pub fn is_checkpointed(name: &str) -> bool {
    !name.rsplit('/').next().unwrap_or(name).starts_with("LOG")
}

/// What one checkpoint uploads.
#[derive(Debug, PartialEq, Eq)]
pub struct Upload {
    /// Every file of the checkpoint, by name: the manifest's list.
    pub files: Vec<FileRef>,
    /// The files to upload now: every non-SST file, and SSTs not uploaded before.
    pub upload: Vec<FileRef>,
}

impl Upload {
    pub fn bytes_total(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }

    pub fn bytes_uploaded(&self) -> u64 {
        self.upload.iter().map(|f| f.bytes).sum()
    }
}

/// The upload of checkpoint `id` from the copy's files (name, bytes), given the SST
/// objects already in the store.
pub fn plan_upload(
    id: &str,
    incarnation: u32,
    copy: impl IntoIterator<Item = (String, u64)>,
    uploaded: &BTreeSet<String>,
) -> Upload {
    let mut copy: Vec<(String, u64)> = copy
        .into_iter()
        .filter(|(name, _)| is_checkpointed(name))
        .collect();
    copy.sort();
    let files: Vec<FileRef> = copy
        .into_iter()
        .map(|(name, bytes)| FileRef {
            object: object_of(id, incarnation, &name),
            name,
            bytes,
        })
        .collect();
    let upload = files
        .iter()
        .filter(|f| !is_sst(&f.name) || !uploaded.contains(&f.object))
        .cloned()
        .collect();
    Upload { files, upload }
}

/// Which manifests retention deletes (all but the newest `keep`) and which it keeps.
pub fn split_manifests(mut manifests: Vec<String>, keep: usize) -> (Vec<String>, Vec<String>) {
    manifests.sort();
    let kept = manifests.split_off(manifests.len().saturating_sub(keep));
    (manifests, kept)
}

/// The file objects (`sst/`, `files/`) no kept manifest references: retention deletes
/// exactly these.
pub fn unreferenced(
    referenced: &BTreeSet<String>,
    stored: impl IntoIterator<Item = String>,
) -> Vec<String> {
    stored
        .into_iter()
        .filter(|key| !referenced.contains(key))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(files: &[FileRef]) -> Vec<&str> {
        files.iter().map(|f| f.object.as_str()).collect()
    }

    #[test]
    fn keys_name_what_they_hold_and_ids_sort_as_taken() {
        assert_eq!(id_at(1_796_000_000_123), "1796000000123");
        assert!(id_at(999) < id_at(1_000));
        assert_eq!(
            manifest_key("0000000000999"),
            "manifests/0000000000999.json"
        );
        assert_eq!(
            manifest_id("manifests/0000000000999.json"),
            Some("0000000000999")
        );
        assert_eq!(manifest_id("sst/1/000012.sst"), None);
        assert_eq!(savepoint_key("17"), "savepoints/17.gsp");
        assert_eq!(object_of("17", 3, "000012.sst"), "sst/3/000012.sst");
        assert_eq!(
            object_of("17", 3, "MANIFEST-000005"),
            "files/17/MANIFEST-000005"
        );
    }

    #[test]
    fn an_upload_sends_every_small_file_and_only_new_ssts_and_skips_rocksdb_logs() {
        let copy = [
            ("p0/000012.sst".to_string(), 100),
            ("p1/000012.sst".to_string(), 200),
            ("p0/CURRENT".to_string(), 16),
            ("p0/LOG".to_string(), 5),
            ("p1/LOG.old.1".to_string(), 5),
            ("p1/MANIFEST-000005".to_string(), 50),
        ];
        let uploaded = BTreeSet::from(["sst/3/p0/000012.sst".to_string()]);
        let plan = plan_upload("17", 3, copy, &uploaded);
        assert_eq!(
            names(&plan.files),
            [
                "sst/3/p0/000012.sst",
                "files/17/p0/CURRENT",
                "sst/3/p1/000012.sst",
                "files/17/p1/MANIFEST-000005"
            ]
        );
        assert_eq!(
            names(&plan.upload),
            [
                "files/17/p0/CURRENT",
                "sst/3/p1/000012.sst",
                "files/17/p1/MANIFEST-000005"
            ]
        );
        assert_eq!(plan.bytes_total(), 366);
        assert_eq!(plan.bytes_uploaded(), 266);
        // an SST of the same name from another incarnation is a different object
        let other = plan_upload("18", 4, [("p0/000012.sst".to_string(), 100)], &uploaded);
        assert_eq!(names(&other.upload), ["sst/4/p0/000012.sst"]);
    }

    #[test]
    fn retention_keeps_the_newest_manifests_and_deletes_only_what_none_of_them_names() {
        let manifests = ["manifests/3.json", "manifests/1.json", "manifests/2.json"]
            .map(String::from)
            .to_vec();
        let (old, kept) = split_manifests(manifests.clone(), 2);
        assert_eq!(old, ["manifests/1.json"]);
        assert_eq!(kept, ["manifests/2.json", "manifests/3.json"]);
        let (old, kept) = split_manifests(manifests, 5);
        assert!(old.is_empty());
        assert_eq!(kept.len(), 3);

        let referenced = BTreeSet::from(["sst/1/a.sst".to_string(), "files/3/CURRENT".to_string()]);
        let stored = [
            "sst/1/a.sst",
            "sst/1/b.sst",
            "files/1/CURRENT",
            "files/3/CURRENT",
        ]
        .map(String::from);
        assert_eq!(
            unreferenced(&referenced, stored),
            ["sst/1/b.sst", "files/1/CURRENT"]
        );
    }
}
