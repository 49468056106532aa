//! Object storage for checkpoints and savepoints: an S3-compatible bucket through
//! `aws-sdk-s3`, or a local folder. Keys are relative to the configured prefix; a local
//! write lands under a temporary name and is renamed, so a reader never sees half a file.

use std::path::{Path, PathBuf};

use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use aws_sdk_s3::primitives::ByteStream;
use tokio::io::AsyncWriteExt;

use crate::config::CheckpointTarget;

#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("object store: {op} {key}: {reason}")]
    Failed {
        op: &'static str,
        key: String,
        reason: String,
    },
    #[error("object store: {key} does not exist")]
    NotFound { key: String },
}

fn failed(op: &'static str, key: &str, reason: impl std::fmt::Display) -> ObjectError {
    ObjectError::Failed {
        op,
        key: key.to_owned(),
        reason: reason.to_string(),
    }
}

/// A bucket prefix or a folder holding checkpoints and savepoints.
#[derive(Clone, Debug)]
pub enum Objects {
    Local(PathBuf),
    S3 {
        client: aws_sdk_s3::Client,
        bucket: String,
        prefix: String,
    },
}

impl Objects {
    pub async fn connect(target: &CheckpointTarget) -> Self {
        match target {
            CheckpointTarget::Local(dir) => Objects::Local(dir.clone()),
            CheckpointTarget::S3(s3) => {
                let mut builder = match (&s3.access_key, &s3.secret_key) {
                    (Some(access), Some(secret)) => aws_sdk_s3::config::Builder::new()
                        .behavior_version(BehaviorVersion::latest())
                        .credentials_provider(Credentials::new(
                            access,
                            secret.expose(),
                            None,
                            None,
                            "geostate",
                        )),
                    _ => aws_sdk_s3::config::Builder::from(
                        &aws_config::defaults(BehaviorVersion::latest()).load().await,
                    ),
                };
                builder = builder
                    .region(Region::new(s3.region.clone()))
                    .force_path_style(s3.path_style)
                    // many S3-compatible servers reject the SDK's default CRC32 trailers
                    .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
                    .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
                    .timeout_config(
                        aws_sdk_s3::config::timeout::TimeoutConfig::builder()
                            .connect_timeout(s3.timeout)
                            .read_timeout(s3.timeout)
                            .build(),
                    );
                if let Some(endpoint) = &s3.endpoint {
                    builder = builder.endpoint_url(endpoint);
                }
                Objects::S3 {
                    client: aws_sdk_s3::Client::from_conf(builder.build()),
                    bucket: s3.bucket.clone(),
                    prefix: s3.prefix.clone(),
                }
            }
        }
    }

    /// Where `key` lives, for people: `s3://bucket/prefix/key` or a path.
    pub fn describe(&self, key: &str) -> String {
        match self {
            Objects::Local(dir) => dir.join(key).display().to_string(),
            Objects::S3 { bucket, prefix, .. } => format!("s3://{bucket}/{prefix}{key}"),
        }
    }

    pub async fn put_file(&self, key: &str, path: &Path) -> Result<(), ObjectError> {
        match self {
            Objects::Local(dir) => {
                let (target, tmp) = local_target(dir, key).await?;
                tokio::fs::copy(path, &tmp)
                    .await
                    .map_err(|e| failed("put", key, e))?;
                sync_and_rename(&tmp, &target)
                    .await
                    .map_err(|e| failed("put", key, e))
            }
            Objects::S3 {
                client,
                bucket,
                prefix,
            } => {
                let body = ByteStream::from_path(path)
                    .await
                    .map_err(|e| failed("put", key, e))?;
                s3_put(client, bucket, prefix, key, body).await
            }
        }
    }

    pub async fn put_bytes(&self, key: &str, bytes: Vec<u8>) -> Result<(), ObjectError> {
        match self {
            Objects::Local(dir) => {
                let (target, tmp) = local_target(dir, key).await?;
                tokio::fs::write(&tmp, bytes)
                    .await
                    .map_err(|e| failed("put", key, e))?;
                sync_and_rename(&tmp, &target)
                    .await
                    .map_err(|e| failed("put", key, e))
            }
            Objects::S3 {
                client,
                bucket,
                prefix,
            } => s3_put(client, bucket, prefix, key, ByteStream::from(bytes)).await,
        }
    }

    /// Downloads `key` into the new file `path`; returns its size.
    pub async fn get_to_file(&self, key: &str, path: &Path) -> Result<u64, ObjectError> {
        match self {
            Objects::Local(dir) => {
                let source = dir.join(key);
                if !source.exists() {
                    return Err(ObjectError::NotFound {
                        key: key.to_owned(),
                    });
                }
                tokio::fs::copy(&source, path)
                    .await
                    .map_err(|e| failed("get", key, e))
            }
            Objects::S3 {
                client,
                bucket,
                prefix,
            } => {
                let response = s3_get(client, bucket, prefix, key).await?;
                let mut file = tokio::fs::File::create(path)
                    .await
                    .map_err(|e| failed("get", key, e))?;
                let mut body = response.body;
                let mut size = 0u64;
                while let Some(chunk) = body.try_next().await.map_err(|e| failed("get", key, e))? {
                    size += chunk.len() as u64;
                    file.write_all(&chunk)
                        .await
                        .map_err(|e| failed("get", key, e))?;
                }
                file.sync_all().await.map_err(|e| failed("get", key, e))?;
                Ok(size)
            }
        }
    }

    pub async fn get_bytes(&self, key: &str) -> Result<Vec<u8>, ObjectError> {
        match self {
            Objects::Local(dir) => match tokio::fs::read(dir.join(key)).await {
                Ok(bytes) => Ok(bytes),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(ObjectError::NotFound {
                    key: key.to_owned(),
                }),
                Err(e) => Err(failed("get", key, e)),
            },
            Objects::S3 {
                client,
                bucket,
                prefix,
            } => {
                let response = s3_get(client, bucket, prefix, key).await?;
                let bytes = response
                    .body
                    .collect()
                    .await
                    .map_err(|e| failed("get", key, e))?;
                Ok(bytes.into_bytes().to_vec())
            }
        }
    }

    /// Every key starting with `under`, sorted.
    pub async fn list(&self, under: &str) -> Result<Vec<String>, ObjectError> {
        let mut keys = Vec::new();
        match self {
            Objects::Local(dir) => {
                let mut pending = vec![dir.clone()];
                while let Some(folder) = pending.pop() {
                    let mut entries = match tokio::fs::read_dir(&folder).await {
                        Ok(entries) => entries,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(failed("list", under, e)),
                    };
                    while let Some(entry) = entries
                        .next_entry()
                        .await
                        .map_err(|e| failed("list", under, e))?
                    {
                        let path = entry.path();
                        let kind = entry
                            .file_type()
                            .await
                            .map_err(|e| failed("list", under, e))?;
                        if kind.is_dir() {
                            pending.push(path);
                            continue;
                        }
                        let Ok(rel) = path.strip_prefix(dir) else {
                            continue;
                        };
                        let key = rel.to_string_lossy().replace('\\', "/");
                        if key.starts_with(under) && !key.contains(".tmp-") {
                            keys.push(key);
                        }
                    }
                }
            }
            Objects::S3 {
                client,
                bucket,
                prefix,
            } => {
                let mut token = None;
                loop {
                    let page = client
                        .list_objects_v2()
                        .bucket(bucket)
                        .prefix(format!("{prefix}{under}"))
                        .set_continuation_token(token)
                        .send()
                        .await
                        .map_err(|e| {
                            failed("list", under, aws_sdk_s3::error::DisplayErrorContext(e))
                        })?;
                    for object in page.contents() {
                        if let Some(key) =
                            object.key().and_then(|k| k.strip_prefix(prefix.as_str()))
                        {
                            keys.push(key.to_owned());
                        }
                    }
                    token = page.next_continuation_token().map(str::to_owned);
                    if token.is_none() {
                        break;
                    }
                }
            }
        }
        keys.sort();
        Ok(keys)
    }

    pub async fn delete(&self, key: &str) -> Result<(), ObjectError> {
        match self {
            Objects::Local(dir) => match tokio::fs::remove_file(dir.join(key)).await {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(failed("delete", key, e)),
            },
            Objects::S3 {
                client,
                bucket,
                prefix,
            } => {
                client
                    .delete_object()
                    .bucket(bucket)
                    .key(format!("{prefix}{key}"))
                    .send()
                    .await
                    .map_err(|e| {
                        failed("delete", key, aws_sdk_s3::error::DisplayErrorContext(e))
                    })?;
                Ok(())
            }
        }
    }
}

/// PUT of `prefix + key`.
async fn s3_put(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    prefix: &str,
    key: &str,
    body: ByteStream,
) -> Result<(), ObjectError> {
    client
        .put_object()
        .bucket(bucket)
        .key(format!("{prefix}{key}"))
        .body(body)
        .send()
        .await
        .map_err(|e| failed("put", key, aws_sdk_s3::error::DisplayErrorContext(e)))?;
    Ok(())
}

/// GET of `prefix + key`; a missing key is `NotFound`.
async fn s3_get(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    prefix: &str,
    key: &str,
) -> Result<aws_sdk_s3::operation::get_object::GetObjectOutput, ObjectError> {
    client
        .get_object()
        .bucket(bucket)
        .key(format!("{prefix}{key}"))
        .send()
        .await
        .map_err(|e| {
            if e.as_service_error().is_some_and(|s| s.is_no_such_key()) {
                ObjectError::NotFound {
                    key: key.to_owned(),
                }
            } else {
                failed("get", key, aws_sdk_s3::error::DisplayErrorContext(e))
            }
        })
}

/// The file for `key` under `dir` and the temporary name it is written under first;
/// creates the folders.
async fn local_target(dir: &Path, key: &str) -> Result<(PathBuf, PathBuf), ObjectError> {
    let target = dir.join(key);
    let mut tmp = target.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    if let Some(parent) = target.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| failed("put", key, e))?;
    }
    Ok((target, PathBuf::from(tmp)))
}

async fn sync_and_rename(tmp: &Path, target: &Path) -> std::io::Result<()> {
    tokio::fs::File::open(tmp).await?.sync_all().await?;
    tokio::fs::rename(tmp, target).await
}
