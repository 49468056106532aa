//! Checkpoints, restore and savepoints on the real parts: a node process of the real
//! binary, real Kafka, and the S3-compatible server (the cluster's, or one of the test's
//! own that it stops mid-upload).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use common::{
    Node, S3Endpoint, Topics, cluster, counter, free_port, produce_all, producer, s3_client,
    s3_keys, unique,
};
use geostate::pb;
use geostate::pb::admin_client::AdminClient;
use geostate::workload::Rng;

/// `n` increments over `keys` counters, and the totals they add up to.
fn increments(
    rng: &mut Rng,
    n: usize,
    keys: u64,
    expected: &mut BTreeMap<String, i64>,
) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|_| {
            let k = rng.below(keys);
            let (key, add) = if rng.below(2) == 0 {
                (format!("trips/c{k}"), 1 + rng.below(3) as i64)
            } else {
                (format!("drivers/c{k}"), rng.below(7) as i64 - 3)
            };
            *expected.entry(key.clone()).or_default() += add;
            let payload = format!(r#"{{"key":"{key}","add":{add}}}"#).into_bytes();
            (key, payload)
        })
        .collect()
}

async fn assert_totals(node: &Node, expected: &BTreeMap<String, i64>) -> anyhow::Result<()> {
    let keys: Vec<String> = expected.keys().cloned().collect();
    let mut state = node.state().await?;
    let mut wrong = Vec::new();
    for chunk in keys.chunks(500) {
        for v in state
            .batch_get(pb::BatchGetRequest {
                keys: chunk.to_vec(),
                window: None,
            })
            .await?
            .into_inner()
            .values
        {
            if expected[&v.key] != counter(&v) {
                wrong.push((v.key.clone(), counter(&v), expected[&v.key]));
            }
        }
    }
    if !wrong.is_empty() {
        bail!(
            "{} counters wrong, e.g. (key, got, expected) {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(4)]
        );
    }
    Ok(())
}

async fn admin(node: &Node) -> anyhow::Result<AdminClient<tonic::transport::Channel>> {
    Ok(AdminClient::connect(node.grpc.clone()).await?)
}

/// The node's checkpoint status (`Admin/Status`).
async fn checkpoint_status(node: &Node) -> anyhow::Result<pb::CheckpointStatus> {
    node.status()
        .await?
        .checkpoint
        .context("no checkpoint status")
}

/// `Admin/Checkpoint`: a checkpoint now, answered once its manifest is written.
async fn checkpoint_now(node: &Node) -> anyhow::Result<pb::CheckpointResponse> {
    Ok(admin(node)
        .await?
        .checkpoint(pb::CheckpointRequest {})
        .await?
        .into_inner())
}

/// Under continuous ingest, checkpoints to the cluster's S3 server every second; the node
/// is killed with SIGKILL, its data dir deleted, and it restarts: it restores the newest
/// checkpoint, replays the log after it, and every counter is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_and_a_wiped_disk_restore_from_s3_with_exact_totals() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "ckpt", 4).await?;
    let dir = tempfile::tempdir()?;
    let node_dir = dir.path();
    let mut node = Node::configure(node_dir, &kafka, &topics)?;
    node.set("checkpoint.interval", "\"1s\"");
    node.set("checkpoint.restore-on-empty", "true");
    let prefix = format!("{}/", unique("ckpt-test"));
    node.checkpoint_to_s3(&cluster.s3, &cluster.s3.endpoint, &prefix);

    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut expected = BTreeMap::new();
    let (first, second) = (
        increments(&mut rng, 120_000, 500, &mut expected),
        increments(&mut rng, 10_000, 500, &mut expected),
    );
    node.start().await?;
    let producer = producer(&kafka)?;
    // a steady stream (20,000 events/s), so the kill lands mid-ingest
    let feed = {
        let (producer, topic) = (producer.clone(), topics.updates.clone());
        tokio::spawn(async move {
            for chunk in first.chunks(2_000) {
                produce_all(&producer, &topic, chunk).await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(())
        })
    };
    // at least two checkpoints while events keep arriving
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let status = node.status().await?;
        let taken = status.checkpoint.as_ref().map_or(0, |c| c.taken);
        if taken >= 2 && status.events_applied >= 20_000 {
            println!(
                "kill -9 after {} events, {taken} checkpoints",
                status.events_applied
            );
            break;
        }
        if Instant::now() > until {
            bail!("no two checkpoints within 120 s: {status:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    node.kill9();
    std::fs::remove_dir_all(node_dir.join("data"))?;
    feed.await??;
    node.start().await?;
    let restored = checkpoint_status(&node).await?;
    assert!(
        restored.restored_from.starts_with("checkpoint "),
        "not restored from a checkpoint: {restored:?}"
    );
    produce_all(&producer, &topics.updates, &second).await?;
    node.caught_up(Duration::from_secs(120)).await?;
    assert_totals(&node, &expected).await
}

/// One partition's instance lost (the others intact): the node refuses to start, naming
/// it; `geostate restore --partition` brings that partition back alone from the newest
/// checkpoint, and after the restart every counter is exact: the restored partition
/// merges what the region shipped for it since the copy and replays the rest, the others
/// keep their own newer state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_partition_restores_alone_with_exact_totals() -> anyhow::Result<()> {
    const LOST: &str = "1";
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "ckpt-part", 4).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    let prefix = format!("{}/", unique("ckpt-part"));
    node.checkpoint_to_s3(&cluster.s3, &cluster.s3.endpoint, &prefix);
    // the one checkpoint is the test's own
    node.set("checkpoint.interval", "\"1h\"");

    let mut rng = Rng(0x0ddb_a11c_afe5_eed5);
    let mut expected = BTreeMap::new();
    let (before, after, later) = (
        increments(&mut rng, 20_000, 200, &mut expected),
        increments(&mut rng, 5_000, 200, &mut expected),
        increments(&mut rng, 5_000, 200, &mut expected),
    );
    node.start().await?;
    let producer = producer(&kafka)?;
    produce_all(&producer, &topics.updates, &before).await?;
    node.caught_up(Duration::from_secs(60)).await?;
    let copy = checkpoint_now(&node).await?;
    // after the copy: applied, and shipped or not when the node dies
    produce_all(&producer, &topics.updates, &after).await?;
    node.caught_up(Duration::from_secs(60)).await?;
    node.kill9();

    let out = restore(&node, &["--partition", LOST])?;
    assert!(
        !out.status.success(),
        "restored over a partition that is there"
    );
    std::fs::remove_dir_all(dir.path().join("data").join(format!("p{LOST}")))?;
    let refused = node
        .start()
        .await
        .err()
        .context("started without partition 1")?;
    assert!(
        refused
            .to_string()
            .contains("no instance of partitions [1]"),
        "{refused}"
    );
    let out = restore(&node, &["--partition", LOST])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    node.start().await?;
    let restored = checkpoint_status(&node).await?;
    assert_eq!(
        restored.restored_from,
        format!("checkpoint {} (partition {LOST})", copy.id)
    );
    produce_all(&producer, &topics.updates, &later).await?;
    node.caught_up(Duration::from_secs(60)).await?;
    assert_totals(&node, &expected).await
}

/// An S3-compatible server of the test's own.
struct S3Server {
    child: Child,
    endpoint: String,
    dir: std::path::PathBuf,
}

impl S3Server {
    fn start(binary: &str, s3: &S3Endpoint, dir: &Path, port: u16) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir.join(&s3.bucket))?;
        let child = Command::new(binary)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--access-key",
                &s3.access_key,
                "--secret-key",
                &s3.secret_key,
            ])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {binary}"))?;
        let until = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > until {
                bail!("s3s-fs did not listen on {port}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Self {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            dir: dir.to_owned(),
        })
    }

    /// Files the server holds (objects and their metadata).
    fn files(&self) -> usize {
        walk(&self.dir)
    }
}

fn walk(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| {
                if e.path().is_dir() {
                    walk(&e.path())
                } else {
                    1
                }
            })
            .sum()
    })
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The S3 server is stopped while a checkpoint uploads its files: the checkpoint fails and
/// is counted, no manifest of it appears, and after the node loses its disk it restores the
/// previous checkpoint and replays to exact totals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_cut_midway_leaves_the_previous_checkpoint_restorable() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "ckpt-cut", 2).await?;
    let dir = tempfile::tempdir()?;
    let port = free_port();
    let s3_dir = dir.path().join("s3");
    let server = S3Server::start(&cluster.tools.s3s_fs, &cluster.s3, &s3_dir, port)?;
    std::fs::create_dir_all(dir.path().join("node"))?;
    let mut node = Node::configure(&dir.path().join("node"), &kafka, &topics)?;
    node.set("checkpoint.interval", "\"0s\"");
    node.set("checkpoint.restore-on-empty", "true");
    // slow uploads, so the server can be stopped halfway through one
    node.set("checkpoint.upload-bytes-per-second", "300000");
    node.checkpoint_to_s3(&cluster.s3, &server.endpoint, "cut/");
    let producer = producer(&kafka)?;
    let mut rng = Rng(0x0bad_cafe_f00d_0001);
    let mut expected = BTreeMap::new();

    node.start().await?;
    produce_all(
        &producer,
        &topics.updates,
        &increments(&mut rng, 2_000, 50, &mut expected),
    )
    .await?;
    node.caught_up(Duration::from_secs(60)).await?;
    let good = checkpoint_now(&node).await?;
    println!("first checkpoint {} ({} bytes)", good.id, good.bytes_total);

    // many new keys: the next checkpoint has megabytes of new SST files to send
    produce_all(
        &producer,
        &topics.updates,
        &increments(&mut rng, 60_000, 30_000, &mut expected),
    )
    .await?;
    node.caught_up(Duration::from_secs(120)).await?;
    let before = server.files();
    let mut client = admin(&node).await?;
    let second = tokio::spawn(async move { client.checkpoint(pb::CheckpointRequest {}).await });
    let until = Instant::now() + Duration::from_secs(60);
    while server.files() == before {
        if Instant::now() > until {
            bail!("the second checkpoint uploaded nothing within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(server); // SIGKILL, mid-upload
    let status = second
        .await?
        .expect_err("a checkpoint without its server must fail");
    println!("second checkpoint: {status}");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    let checkpoint = checkpoint_status(&node).await?;
    assert_eq!((checkpoint.taken, checkpoint.failures), (1, 1));
    assert_eq!(checkpoint.last_id, good.id);

    // lose the disk; the server comes back with what it held
    node.kill9();
    std::fs::remove_dir_all(dir.path().join("node/data"))?;
    let _server = S3Server::start(&cluster.tools.s3s_fs, &cluster.s3, &s3_dir, port)?;
    let client = s3_client(&cluster.s3, &format!("http://127.0.0.1:{port}"));
    let manifests = s3_keys(&client, &cluster.s3.bucket, "cut/manifests/").await?;
    assert_eq!(manifests, [format!("cut/manifests/{}.json", good.id)]);
    node.start().await?;
    let restored = checkpoint_status(&node).await?;
    assert_eq!(restored.restored_from, format!("checkpoint {}", good.id));
    node.caught_up(Duration::from_secs(120)).await?;
    assert_totals(&node, &expected).await
}

/// An S3 endpoint that accepts connections and never answers: each attempt gives up after
/// `checkpoint.s3.timeout`, and `Admin/Checkpoint` fails (UNAVAILABLE, counted) instead of
/// waiting for ever with the checkpoint's hard links pinning deleted SST files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_server_that_never_answers_fails_the_checkpoint_in_bounded_time() -> anyhow::Result<()>
{
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "ckpt-mute", 1).await?;
    let dir = tempfile::tempdir()?;
    let mute = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}", mute.local_addr()?);
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = mute.accept().await {
            open.push(socket); // never read, never answered
        }
    });
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    node.set("checkpoint.interval", "\"0s\"");
    node.checkpoint_to_s3(&cluster.s3, &endpoint, "mute/");
    node.set("checkpoint.s3.timeout", "\"1s\"");
    node.start().await?;
    let started = Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(120), checkpoint_now(&node))
        .await
        .context("Admin/Checkpoint still waiting after 120 s")?;
    let status = answer
        .expect_err("a checkpoint to a server that never answers")
        .downcast::<tonic::Status>()?;
    println!(
        "failed after {:.1} s: {status}",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(status.code(), tonic::Code::Unavailable);
    let checkpoint = checkpoint_status(&node).await?;
    assert_eq!((checkpoint.taken, checkpoint.failures), (0, 1));
    held.abort();
    Ok(())
}

/// A savepoint, the data dir wiped, `geostate restore --savepoint`: identical state. A
/// truncated savepoint is refused with a reason. Another region's node refuses it unless
/// asked to seed from it, and then holds the same state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_savepoint_restores_identical_state_and_a_truncated_one_is_refused() -> anyhow::Result<()>
{
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "savepoint", 2).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    node.set("checkpoint.interval", "\"0s\"");
    node.start().await?;
    let mut state = node.state().await?;
    for i in 0..200i64 {
        let (key, op) = match i % 3 {
            0 => (
                format!("trips/{}", i % 11),
                pb::update_request::Op::Add(1 + i % 5),
            ),
            1 => (
                format!("drivers/{}", i % 7),
                pb::update_request::Op::Add(i % 9 - 4),
            ),
            _ => (
                format!("zones/{}", i % 5),
                pb::update_request::Op::Set(format!("zone-{i}").into_bytes()),
            ),
        };
        state
            .update(pb::UpdateRequest {
                key,
                op: Some(op),
                id: format!("op-{i}"),
                event_time_ms: 0,
            })
            .await?;
    }
    let before = scan_all(&node).await?;
    let saved = admin(&node)
        .await?
        .savepoint(pb::SavepointRequest {})
        .await?
        .into_inner();
    println!(
        "savepoint {} at {} ({} entries)",
        saved.id, saved.location, saved.entries
    );
    node.terminate(Duration::from_secs(20)).await?;
    std::fs::remove_dir_all(dir.path().join("data"))?;

    // a cut-off copy is refused, and leaves the data dir empty
    let file = dir
        .path()
        .join(format!("checkpoints/savepoints/{}.gsp", saved.id));
    let bytes = std::fs::read(&file)?;
    let truncated = dir.path().join("truncated.gsp");
    std::fs::write(&truncated, &bytes[..bytes.len() - 10])?;
    let out = restore(
        &node,
        &["--savepoint", truncated.to_str().unwrap_or_default()],
    )?;
    assert!(!out.status.success(), "a truncated savepoint was restored");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("truncated"), "{stderr}");
    assert!(
        !dir.path().join("data").exists()
            || std::fs::read_dir(dir.path().join("data"))?.next().is_none()
    );

    let out = restore(&node, &["--savepoint", &saved.id])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    node.start().await?;
    let status = node.status().await?;
    assert_eq!(
        status.checkpoint.map(|c| c.restored_from),
        Some(format!("savepoint {}", saved.id))
    );
    assert_eq!(scan_all(&node).await?, before);

    // a new region seeded from it
    let other_dir = tempfile::tempdir()?;
    let other_topics = Topics::create(&kafka, "seeded", 2).await?;
    let mut other =
        Node::configure_region(other_dir.path(), "eu-west-1", &kafka, &other_topics, &[])?;
    let path = file.to_str().unwrap_or_default();
    let out = restore(&other, &["--savepoint", path])?;
    assert!(
        !out.status.success(),
        "another region's savepoint was restored whole"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("written by region us-east-1"), "{stderr}");
    let out = restore(&other, &["--savepoint", path, "--seed"])?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    other.start().await?;
    assert_eq!(scan_all(&other).await?, before);
    Ok(())
}

fn restore(node: &Node, args: &[&str]) -> anyhow::Result<std::process::Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_geostate"))
        .arg("restore")
        .arg("--config")
        .arg(&node.config)
        .args(node.set_args())
        .args(args)
        .output()?)
}

async fn scan_all(node: &Node) -> anyhow::Result<BTreeMap<String, pb::Value>> {
    let mut state = node.state().await?;
    let page = state
        .scan(pb::ScanRequest {
            prefix: String::new(),
            page_token: String::new(),
            limit: 1000,
            window: None,
        })
        .await?
        .into_inner();
    Ok(page
        .values
        .into_iter()
        .map(|mut v| {
            v.freshness = None;
            (v.key.clone(), v)
        })
        .collect())
}

/// With `keep = 2`, after five checkpoints (new data before each) only two manifests and
/// exactly the files they reference remain in the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_k_manifests_and_only_their_files() -> anyhow::Result<()> {
    const KEEP: usize = 2;
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "retention", 2).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    node.set("checkpoint.interval", "\"0s\"");
    node.set("checkpoint.keep", &KEEP.to_string());
    let prefix = format!("{}/", unique("retention"));
    node.checkpoint_to_s3(&cluster.s3, &cluster.s3.endpoint, &prefix);
    node.start().await?;
    let producer = producer(&kafka)?;
    let mut rng = Rng(0x5eed_0000_0000_0007);
    let mut expected = BTreeMap::new();
    let mut ids = Vec::new();
    for _ in 0..KEEP + 3 {
        produce_all(
            &producer,
            &topics.updates,
            &increments(&mut rng, 3_000, 2_000, &mut expected),
        )
        .await?;
        node.caught_up(Duration::from_secs(60)).await?;
        ids.push(checkpoint_now(&node).await?.id);
    }
    let client = s3_client(&cluster.s3, &cluster.s3.endpoint);
    let keys = s3_keys(&client, &cluster.s3.bucket, &prefix).await?;
    let manifests: Vec<&String> = keys.iter().filter(|k| k.contains("/manifests/")).collect();
    let newest: Vec<String> = ids[ids.len() - KEEP..]
        .iter()
        .map(|id| format!("{prefix}manifests/{id}.json"))
        .collect();
    assert_eq!(manifests, newest.iter().collect::<Vec<_>>());
    let mut referenced = BTreeSet::new();
    for key in &newest {
        let manifest = manifest_at(&client, &cluster.s3.bucket, key).await?;
        referenced.extend(
            manifest
                .files
                .into_iter()
                .map(|f| format!("{prefix}{}", f.object)),
        );
    }
    let files: BTreeSet<String> = keys
        .iter()
        .filter(|k| !k.contains("/manifests/"))
        .cloned()
        .collect();
    assert_eq!(
        files, referenced,
        "files left = files the kept manifests reference"
    );
    Ok(())
}

/// The checkpoint manifest stored at `key`.
async fn manifest_at(
    client: &aws_sdk_s3::Client,
    bucket: &str,
    key: &str,
) -> anyhow::Result<geostate::checkpoint::Manifest> {
    let body = client
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await?
        .body
        .collect()
        .await?
        .into_bytes();
    Ok(serde_json::from_slice(&body)?)
}

/// A checkpoint names only files that are stored: when SSTs it uploaded before are gone
/// (another node of the region owned partition 0 meanwhile, and its retention deleted
/// them), the next checkpoint uploads them again rather than naming them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_uploads_again_the_files_another_takers_retention_deleted()
-> anyhow::Result<()> {
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let topics = Topics::create(&kafka, "retaken", 2).await?;
    let dir = tempfile::tempdir()?;
    let mut node = Node::configure(dir.path(), &kafka, &topics)?;
    node.set("checkpoint.interval", "\"0s\"");
    let prefix = format!("{}/", unique("retaken"));
    node.checkpoint_to_s3(&cluster.s3, &cluster.s3.endpoint, &prefix);
    node.start().await?;
    let producer = producer(&kafka)?;
    let mut expected = BTreeMap::new();
    let events = increments(&mut Rng(0x5eed_0000_0000_0011), 2_000, 500, &mut expected);
    produce_all(&producer, &topics.updates, &events).await?;
    node.caught_up(Duration::from_secs(60)).await?;
    checkpoint_now(&node).await?;

    // what another taker's retention does to files its manifests do not name
    let client = s3_client(&cluster.s3, &cluster.s3.endpoint);
    let ssts: Vec<String> = s3_keys(&client, &cluster.s3.bucket, &prefix)
        .await?
        .into_iter()
        .filter(|k| k.contains("/sst/"))
        .collect();
    assert!(!ssts.is_empty(), "the first checkpoint uploaded SSTs");
    for key in &ssts {
        client
            .delete_object()
            .bucket(&cluster.s3.bucket)
            .key(key)
            .send()
            .await?;
    }

    let id = checkpoint_now(&node).await?.id;
    let key = format!("{prefix}manifests/{id}.json");
    let manifest = manifest_at(&client, &cluster.s3.bucket, &key).await?;
    let stored: BTreeSet<String> = s3_keys(&client, &cluster.s3.bucket, &prefix)
        .await?
        .into_iter()
        .collect();
    let missing: Vec<String> = manifest
        .files
        .into_iter()
        .map(|f| format!("{prefix}{}", f.object))
        .filter(|key| !stored.contains(key))
        .collect();
    assert!(
        missing.is_empty(),
        "the manifest names files not stored: {missing:?}"
    );
    Ok(())
}
