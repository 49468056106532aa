//! `Watch`: a stream of the values of keys under a prefix as they change. A task per
//! watcher feeds it from this node's applied batches and, unless the request was routed
//! here, from a routed `Watch` at every other owner of the region's partitions; it ends
//! the stream when a partition moves between the region's nodes, and cuts off a watcher
//! that leaves its queue full rather than buffer for it.
//!
//! ```text
//!  ingest batches ──changed──┐
//!  other owners' Watch ──────┼──► watched (bounded queue) ──► client
//!  every second ──checked────┘    (moved: UNAVAILABLE; windows that became final)
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast::{self, error::RecvError};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Interval;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::{ApiError, Handler, convert, failed, windows};
use crate::metrics as m;
use crate::partition::Change;
use crate::pb;
use crate::shutdown::stopped;
use crate::window;

/// Values a `Watch` stream may have queued unread before the watcher is cut off.
const WATCH_QUEUE: usize = 256;
/// How often a `Watch` checks that no partition moved between the region's nodes.
const WATCH_OWNERS_EVERY: Duration = Duration::from_secs(1);

/// What a watcher's stream carries: a value, or why the stream ended.
type Sent = Result<pb::Value, Status>;

/// One open `Watch`, as the task feeding it holds it.
struct Watcher {
    handler: Handler,
    prefix: String,
    /// The request was routed here: this node's changes only.
    routed: bool,
    /// This node's owned partitions when the stream opened.
    owned: BTreeSet<i32>,
    /// The region's other owners when the stream opened.
    others: BTreeSet<String>,
    /// Per owned partition, the lowest watermark over the regions when last looked:
    /// windows that close as it rises are reported final.
    lowest: BTreeMap<i32, Option<u64>>,
    tx: mpsc::Sender<Sent>,
}

impl Handler {
    /// Opens a `Watch` of `prefix` (see `State::watch`): refused beyond
    /// `api.max-watchers`, then fed by its own task.
    pub(super) async fn open_watch(
        &self,
        prefix: String,
        routed: bool,
    ) -> Result<ReceiverStream<Sent>, Status> {
        self.admit_watcher()?;
        let changes = self.0.owned.changes.subscribe();
        let stop = self.0.stop.clone();
        let owned = self.0.owned.owned();
        let others = if routed {
            BTreeSet::new()
        } else {
            self.other_owners(&prefix).await?
        };
        let (upstreams, from_others) = self.fan_in(&prefix, &others).await?;
        let check = tokio::time::interval(WATCH_OWNERS_EVERY);
        let lowest = self.lowest_watermarks(&prefix, &owned).await?;
        // one slot more than the queue: the reason a watcher is cut off always fits
        let (tx, rx) = mpsc::channel(WATCH_QUEUE + 1);
        let watcher = Watcher {
            handler: self.clone(),
            prefix,
            routed,
            owned,
            others,
            lowest,
            tx,
        };
        tokio::spawn(watcher.run(changes, stop, from_others, upstreams, check));
        Ok(ReceiverStream::new(rx))
    }

    /// Refuses a watcher while `api.max-watchers` streams are open.
    fn admit_watcher(&self) -> Result<(), Status> {
        let max = self.0.config.api.max_watchers;
        // the count includes this node's own internal receivers: none today
        if self.0.owned.changes.receiver_count() >= max {
            return Err(ApiError::TooMuch(format!(
                "{max} Watch streams are open; api.max-watchers is {max}"
            ))
            .into());
        }
        Ok(())
    }

    /// A routed `Watch` of `prefix` at each of `others`, their values merged into one
    /// queue. The tasks reading them end when the returned set is dropped.
    async fn fan_in(
        &self,
        prefix: &str,
        others: &BTreeSet<String>,
    ) -> Result<(JoinSet<()>, mpsc::Receiver<Sent>), Status> {
        // every other owner's values, and an error when its stream ends
        let (theirs, from_others) = mpsc::channel(WATCH_QUEUE);
        let mut upstreams = JoinSet::new();
        for node in others {
            let (mut client, request) = self
                .node_client(
                    node,
                    pb::WatchRequest {
                        prefix: prefix.to_owned(),
                    },
                )
                .map_err(Status::from)?;
            let mut stream = client
                .watch(request)
                .await
                .map_err(|status| {
                    Status::from(ApiError::Routed {
                        node: node.clone(),
                        status,
                    })
                })?
                .into_inner();
            let theirs = theirs.clone();
            upstreams.spawn(async move {
                while let Ok(Some(value)) = stream.message().await {
                    if theirs.send(Ok(value)).await.is_err() {
                        return;
                    }
                }
                let _ = theirs
                    .send(Err(failed("Watch", ApiError::WatchMoved)))
                    .await;
            });
        }
        drop(theirs);
        Ok((upstreams, from_others))
    }

    /// Per partition of `owned`, the lowest watermark over the regions now; none when no
    /// windowed namespace overlaps `prefix` (no window of it can become final).
    async fn lowest_watermarks(
        &self,
        prefix: &str,
        owned: &BTreeSet<i32>,
    ) -> Result<BTreeMap<i32, Option<u64>>, Status> {
        let windowed =
            (self.0.config.namespaces.iter()).any(|ns| ns.window.is_some() && ns.overlaps(prefix));
        // RocksDB reads: off the async threads
        let (reader, partitions) = (self.clone(), owned.clone());
        let lowest = tokio::task::spawn_blocking(move || {
            let mut lowest: BTreeMap<i32, Option<u64>> = BTreeMap::new();
            for p in partitions.into_iter().filter(|_| windowed) {
                lowest.insert(p, reader.watermarks(p)?.lowest);
            }
            Ok::<_, ApiError>(lowest)
        })
        .await
        .map_err(|e| Status::from(ApiError::Internal(e.to_string())))??;
        Ok(lowest)
    }
}

impl Watcher {
    /// Feeds the stream until the node stops, the watcher goes away or falls behind, an
    /// other owner's stream ends, or a partition moves.
    async fn run(
        mut self,
        mut changes: broadcast::Receiver<Arc<Vec<Change>>>,
        mut stop: tokio::sync::watch::Receiver<bool>,
        mut from_others: mpsc::Receiver<Sent>,
        upstreams: JoinSet<()>,
        mut check: Interval,
    ) {
        // the other owners' readers end when this does
        let _upstreams = upstreams;
        loop {
            let open = tokio::select! {
                () = stopped(&mut stop) => return,
                next = changes.recv() => self.changed(next).await,
                Some(value) = from_others.recv() => {
                    let ended = value.is_err();
                    watched(&self.tx, value) && !ended
                }
                _ = check.tick() => self.checked().await,
            };
            if !open {
                return;
            }
        }
    }

    /// Sends the keys under the prefix an applied batch of this node changed; false once
    /// the stream is over.
    async fn changed(&self, next: Result<Arc<Vec<Change>>, RecvError>) -> bool {
        let batch = match next {
            Ok(batch) => batch,
            Err(RecvError::Lagged(n)) => {
                let behind = ApiError::WatcherBehind { batches: n };
                let _ = self.tx.send(Err(failed("Watch", behind))).await;
                return false;
            }
            Err(RecvError::Closed) => return false,
        };
        let mut windows = Vec::new();
        for (key, state) in batch.iter().filter(|(k, _)| k.starts_with(&self.prefix)) {
            if let (home, Some(slice)) = window::split_slice_key(key) {
                windows.push((home.to_owned(), slice));
                continue;
            }
            let value =
                convert::value(key, state.crdt_type(), Some(state)).map_err(|e| failed("Watch", e));
            if !watched(&self.tx, value) {
                return false;
            }
        }
        if windows.is_empty() {
            return true;
        }
        // a slice changed: its key's newest window holding it, read whole
        let reader = self.handler.clone();
        let values = tokio::task::spawn_blocking(move || reader.changed_windows(windows))
            .await
            .unwrap_or_else(|e| vec![Err(ApiError::Internal(e.to_string()))]);
        for value in values {
            if !watched(&self.tx, value.map_err(|e| failed("Watch", e))) {
                return false;
            }
        }
        true
    }

    /// Every [`WATCH_OWNERS_EVERY`]: ends the stream if a partition moved between the
    /// region's nodes, else sends the windows that became final meanwhile; false once the
    /// stream is over.
    async fn checked(&mut self) -> bool {
        if self.moved().await {
            let _ = self.tx.try_send(Err(failed("Watch", ApiError::WatchMoved)));
            return false;
        }
        if self.lowest.is_empty() {
            return true;
        }
        let (reader, prefix, seen) = (
            self.handler.clone(),
            self.prefix.clone(),
            self.lowest.clone(),
        );
        let closed =
            tokio::task::spawn_blocking(move || reader.windows_closed_since(&prefix, seen))
                .await
                .unwrap_or_else(|e| windows::Closed {
                    risen: BTreeMap::new(),
                    values: vec![Err(ApiError::Internal(e.to_string()))],
                });
        self.lowest.extend(closed.risen);
        for value in closed.values {
            if !watched(&self.tx, value.map_err(|e| failed("Watch", e))) {
                return false;
            }
        }
        true
    }

    /// Whether this node's owned partitions or the region's other owners changed since the
    /// stream opened (other owners that cannot be read now count as unchanged).
    async fn moved(&self) -> bool {
        let now_others = if self.routed {
            Ok(BTreeSet::new())
        } else {
            self.handler.other_owners(&self.prefix).await
        };
        self.handler.0.owned.owned() != self.owned || now_others.is_ok_and(|now| now != self.others)
    }
}

/// Queues `value` for a watcher; false once the stream is over: the client went away, or
/// it left the queue full and is cut off (never buffered for), told why.
fn watched(tx: &mpsc::Sender<Sent>, value: Sent) -> bool {
    if tx.capacity() <= 1 {
        metrics::counter!(m::WATCHERS_DROPPED).increment(1);
        let unread = ApiError::TooMuch(format!(
            "this watcher left {WATCH_QUEUE} values unread; scan and watch again"
        ));
        let _ = tx.try_send(Err(failed("Watch", unread)));
        return false;
    }
    tx.try_send(value).is_ok()
}
