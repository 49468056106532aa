//! Idle partitions: a partition that receives no windowed event keeps its watermark where
//! it is, and would hold every window of its keys open in every region. Its owner moves it
//! on by appending a watermark record to the partition ([`window::WATERMARK_KEY`]); ingest
//! raises the watermark where it meets the record in the log, so a replay judges every
//! event as the first run did. The wall clock only decides *when* a partition counts as
//! idle (its watermark unchanged for `watermark.idle-after`); the value comes from event
//! times: [`idle_target`].
//!
//! ```text
//!  every idle-after: per owned partition p whose watermark did not move since the last look
//!    target = min(highest watermark of this node's other partitions,
//!                 each other region's watermark for p)      (those known)
//!    target > p's watermark ─► append (WATERMARK_KEY, target) to p of the updates topic
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::Config;
use crate::log::{LogError, Out, RenewingProducer};
use crate::partition::Partitions;
use crate::shutdown::stopped;
use crate::store::{Store, StoreError};
use crate::window;

const APPEND_TIMEOUT: Duration = Duration::from_secs(10);

/// The watermark an idle partition moves to: the lowest of the highest watermark among
/// the region's other partitions and each other region's watermark for it (what is
/// known of them), if that is ahead of its own.
pub fn idle_target(
    own: Option<u64>,
    others_here: impl IntoIterator<Item = u64>,
    remotes: impl IntoIterator<Item = u64>,
) -> Option<u64> {
    let target = others_here
        .into_iter()
        .max()
        .into_iter()
        .chain(remotes)
        .min()?;
    own.is_none_or(|own| target > own).then_some(target)
}

pub struct IdleWatermarks {
    pub config: Arc<Config>,
    pub store: Arc<Store>,
    pub owned: Arc<Partitions>,
    pub producer: Arc<RenewingProducer>,
}

#[derive(Debug, thiserror::Error)]
pub enum IdleError {
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl IdleWatermarks {
    pub async fn run(self, mut stop: watch::Receiver<bool>) -> Result<(), IdleError> {
        let every = self.config.watermark.idle_after;
        // per owned partition, its watermark at the last look
        let mut seen: BTreeMap<i32, Option<u64>> = BTreeMap::new();
        loop {
            tokio::select! {
                () = stopped(&mut stop) => return Ok(()),
                () = tokio::time::sleep(every) => {}
            }
            let owned: BTreeSet<i32> = self.owned.owned();
            seen.retain(|p, _| owned.contains(p));
            let store = self.store.clone();
            let read = owned.clone();
            let now = tokio::task::spawn_blocking(move || {
                read.iter()
                    .map(|&p| Ok((p, (store.watermark(p)?, store.remote_watermarks(p)?))))
                    .collect::<Result<BTreeMap<_, _>, StoreError>>()
            })
            .await
            .unwrap_or_else(|e| Err(StoreError::Task(e.to_string())))?;
            for (&p, (own, remotes)) in &now {
                let moved = seen.insert(p, *own) != Some(*own);
                if moved {
                    continue;
                }
                let others = now
                    .iter()
                    .filter(|(q, _)| **q != p)
                    .filter_map(|(_, (w, _))| *w);
                let expected = self.config.replication.remotes.iter();
                let remote = expected.filter_map(|r| remotes.get(&r.region).copied());
                if let Some(target) = idle_target(*own, others, remote) {
                    match self.append(p, target).await {
                        Ok(()) => {
                            tracing::debug!(partition = p, from = ?own, to = target, "idle partition: its watermark moves on");
                        }
                        Err(e) => {
                            tracing::warn!(partition = p, error = %e, "appending an idle partition's watermark record failed; trying again at the next look");
                        }
                    }
                }
            }
        }
    }

    async fn append(&self, partition: i32, watermark_ms: u64) -> Result<(), LogError> {
        let payload = window::encode_watermark(watermark_ms);
        let out = Out {
            topic: &self.config.kafka.updates_topic,
            key: Some(window::WATERMARK_KEY),
            payload: &payload,
            headers: &[],
            partition: Some(partition),
        };
        self.producer.append(&out, APPEND_TIMEOUT).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_partition_follows_the_slowest_of_the_region_and_the_other_regions() {
        // the region's other partitions at 20 and 30, the other region at 25 for it
        assert_eq!(idle_target(Some(10), [20, 30], [25]), Some(25));
        // the other region unknown: the region's most advanced partition
        assert_eq!(idle_target(None, [20, 30], []), Some(30));
        // no other partition here: the other region's
        assert_eq!(idle_target(None, [], [25]), Some(25));
        // never back, and nothing known: nothing
        assert_eq!(idle_target(Some(40), [20, 30], [25]), None);
        assert_eq!(idle_target(None, [], []), None);
    }
}
