//! MirrorMaker 2 copies topic configurations from a source topic to its mirror, but never a
//! lowered `max.message.bytes`: a mirror must take every record its source took. Copied,
//! a limit below the records in flight fails the mirror's writes with RecordTooLarge,
//! which kills the MirrorSourceConnector task for good: the flow stops replicating until
//! MirrorMaker 2 is restarted by hand.
//!
//! Its own test binary: it makes a region's deltas topic refuse writes for half a minute.

mod common;

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use common::failover::{regions, set, wait_value};
use common::unwritable::{LIMIT, Unwritable, max_bytes};
use common::{cluster, run_dir, unique};

/// MirrorMaker 2 logs this line each time a flow's connector synced topic configurations
/// (`sync.topic.configs.interval.seconds` in `regions/local/geocluster/kafka.py`).
const SYNCED: &str = "syncing topic configs took";

/// MirrorMaker 2's log: its length now, and the syncs it logged after `from` bytes.
fn mirror_log(from: u64) -> anyhow::Result<(u64, usize)> {
    use std::io::{Read, Seek, SeekFrom};
    let path = run_dir()?.join("logs").join("mirrormaker2.log");
    let mut log = std::fs::File::open(&path).with_context(|| format!("{}", path.display()))?;
    log.seek(SeekFrom::Start(from))?;
    let mut text = Vec::new();
    log.read_to_end(&mut text)?;
    let syncs = String::from_utf8_lossy(&text).matches(SYNCED).count();
    Ok((from + text.len() as u64, syncs))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_message_size_limit_never_reaches_the_mirror() -> anyhow::Result<()> {
    let cluster = cluster()?;
    let (mut regions, _) = regions(&cluster).await?;
    ensure!(regions.len() >= 2, "the test needs two regions");
    let mut to = regions.pop().context("region")?;
    let from = regions.pop().context("region")?;
    let source = &cluster.regions[&from.name];
    let topic = common::node_config(source)?.kafka.deltas_topic;
    let mirror = format!("{}.{topic}", from.name);

    let (logged, _) = mirror_log(0)?;
    let unwritable = Unwritable::new(&source.kafka, &topic).await?;
    // every flow syncs once per interval; three syncs after the change include one of
    // the flow from `from` to `to`
    let deadline = Instant::now() + Duration::from_secs(120);
    while mirror_log(logged)?.1 < 3 {
        ensure!(
            Instant::now() < deadline,
            "MirrorMaker 2 logged no topic config sync within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mirrored = max_bytes(&cluster.regions[&to.name].kafka, &mirror).await?;
    ensure!(
        mirrored.as_deref() != Some(LIMIT),
        "{mirror} in {} took its source's max.message.bytes = {LIMIT}",
        to.name
    );

    // the flow still replicates once the source takes writes again
    drop(unwritable);
    let key = format!("zones/{}", unique("mirror-config"));
    let mut from = from;
    from.state.update(set(&key, "through")).await?;
    wait_value(&mut to.state, &key, "through", Duration::from_secs(60)).await
}
