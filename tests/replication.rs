//! Two regions, active-active, on real Kafka and RocksDB: each node ships its own deltas
//! and merges the other's (read directly from the other's deltas topic, the single-cluster
//! switch), and concurrent writes on the same keys converge.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::bail;
use common::{Node, Topics, cluster};
use geostate::pb;
use geostate::pb::state_client::StateClient;
use tonic::transport::Channel;

const WRITES_PER_REGION: usize = 600;
/// Few keys, so local batches and merges of remote deltas keep touching the same ones.
const KEYS: usize = 4;
/// Concurrent writers per region.
const WRITERS: usize = 4;

async fn everything(
    state: &mut StateClient<Channel>,
) -> anyhow::Result<BTreeMap<String, pb::Value>> {
    let mut out = BTreeMap::new();
    let mut page_token = String::new();
    loop {
        let page = state
            .scan(pb::ScanRequest {
                prefix: String::new(),
                page_token,
                limit: 1000,
            })
            .await?
            .into_inner();
        for mut v in page.values {
            v.freshness = None; // differs per region by design
            out.insert(v.key.clone(), v);
        }
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        page_token = page.next_page_token;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_in_two_regions_converge_and_count_every_increment() -> anyhow::Result<()>
{
    let cluster = cluster()?;
    let kafka = cluster.regions["us-east-1"].kafka.clone();
    let (ta, tb) = (
        Topics::create(&kafka, "repl-a", 2).await?,
        Topics::create(&kafka, "repl-b", 2).await?,
    );
    let (dir_a, dir_b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let mut a = Node::configure_region(
        dir_a.path(),
        "us-east-1",
        &kafka,
        &ta,
        &[("eu-west-1", &tb.deltas)],
    )?;
    let mut b = Node::configure_region(
        dir_b.path(),
        "eu-west-1",
        &kafka,
        &tb,
        &[("us-east-1", &ta.deltas)],
    )?;
    a.start().await?;
    b.start().await?;

    // both regions write the same keys at the same time
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    let mut writers = Vec::new();
    for (node, seed) in [(&a, 1u64), (&b, 2u64)] {
        let state = node.state().await?;
        let mut plan = Vec::new();
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for i in 0..WRITES_PER_REGION {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = x % KEYS as u64;
            let (key, op) = match i % 3 {
                0 => (
                    format!("requests/{k}"),
                    pb::update_request::Op::Add(1 + (x % 5) as i64),
                ),
                1 => (
                    format!("drivers/{k}"),
                    pb::update_request::Op::Add((x % 7) as i64 - 3),
                ),
                _ => (
                    format!("zones/{k}"),
                    pb::update_request::Op::Set(format!("{seed}-{i}").into_bytes()),
                ),
            };
            if let pb::update_request::Op::Add(n) = op {
                *expected.entry(key.clone()).or_default() += n;
            }
            plan.push((key, op));
        }
        for chunk in plan.chunks(WRITES_PER_REGION / WRITERS) {
            let (mut state, chunk) = (state.clone(), chunk.to_vec());
            writers.push(tokio::spawn(async move {
                for (key, op) in chunk {
                    state
                        .update(pb::UpdateRequest {
                            key,
                            op: Some(op),
                            id: String::new(),
                        })
                        .await?;
                }
                anyhow::Ok(())
            }));
        }
    }
    for w in writers {
        w.await??;
    }

    // both regions converge: identical state, every counter the sum of all acknowledged adds
    let (mut sa, mut sb) = (a.state().await?, b.state().await?);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (va, vb) = (everything(&mut sa).await?, everything(&mut sb).await?);
        let counters_right = expected.iter().all(|(k, n)| {
            [&va, &vb].iter().all(|v| {
                v.get(k).and_then(|v| v.value.clone()) == Some(pb::value::Value::Counter(*n))
            })
        });
        if va == vb && counters_right {
            break;
        }
        if Instant::now() > deadline {
            let differing: Vec<_> = expected
                .keys()
                .chain(va.keys())
                .filter(|k| {
                    va.get(*k) != vb.get(*k)
                        || expected.get(*k).is_some_and(|n| {
                            va.get(*k).and_then(|v| v.value.clone())
                                != Some(pb::value::Value::Counter(*n))
                        })
                })
                .take(3)
                .map(|k| {
                    (
                        k,
                        va.get(k).and_then(|v| v.value.clone()),
                        vb.get(k).and_then(|v| v.value.clone()),
                        expected.get(k),
                    )
                })
                .collect();
            bail!(
                "regions did not converge within 60 s; differing (key, a, b, expected): {differing:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // reads carry freshness: the other region's newest merged delta
    let value = sa
        .get(pb::GetRequest {
            key: "requests/0".into(),
        })
        .await?
        .into_inner();
    let remotes = value.freshness.unwrap_or_default().remotes;
    assert_eq!(remotes.len(), 1);
    assert_eq!(remotes[0].region, "eu-west-1");
    assert!(remotes[0].applied.unwrap_or_default().wall_nanos > 0);
    Ok(())
}
