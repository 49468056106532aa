//! The read path of `Get`, `BatchGet` and `Scan`: values read from the store (a windowed
//! key's through `windows.rs`), each with what its partition holds of every remote region;
//! keys of partitions another node of the region owns are asked of that node.
//!
//! ```text
//!  Get ──────► read ──► read_values ──► store ──► Value + freshness
//!  BatchGet ─► here: read_values        elsewhere: one routed BatchGet per owner
//!  Scan ─────► scan_here (owned partitions) + every other owner's page ──► merged, cut
//! ```

use std::collections::{BTreeMap, BTreeSet};

use super::{ApiError, Handler, convert};
use crate::config::Ownership;
use crate::crdt::CrdtValue;
use crate::pb;
use crate::window;

/// Keys in a `Scan` page whose request sets no limit.
const SCAN_DEFAULT_LIMIT: usize = 100;
/// The most keys in a `Scan` page, whatever its request asks.
const SCAN_MAX_LIMIT: usize = 1000;

impl Handler {
    /// A `leaseholder` read is served only where the key's lease is held, after checking
    /// it: the holder has applied every write it acknowledged, so the read sees them.
    pub(super) async fn read_at_holder(&self, key: &str) -> Result<pb::Value, ApiError> {
        let owned = self
            .0
            .config
            .namespaces
            .lookup(key)
            .is_some_and(|ns| ns.ownership == Ownership::Owned);
        if !owned {
            return Err(ApiError::InvalidArgument(format!(
                "a leaseholder read needs a key in an owned namespace; {key:?} is not"
            )));
        }
        let (shard, epoch) = self.leases()?.epoch_for(key).map_err(ApiError::NotHolder)?;
        self.settled(key, shard, epoch).await?;
        self.read(key, None)
    }

    /// A key's values: one, or for a windowed key one per window `window` names.
    fn read_values(
        &self,
        key: &str,
        window: Option<&pb::WindowSelector>,
    ) -> Result<Vec<pb::Value>, ApiError> {
        let ns =
            self.0.config.namespaces.lookup(key).ok_or_else(|| {
                ApiError::InvalidArgument(format!("key {key:?} is in no namespace"))
            })?;
        if let Some(spec) = &ns.window {
            return self.read_windows(key, spec, ns.crdt, window);
        }
        let mut value = convert::value(key, ns.crdt, self.0.store.get(key)?.as_ref())?;
        self.fill_freshness(&mut value, self.partition_of(key));
        Ok(vec![value])
    }

    /// One value of `key`: a windowed key's one window, not a range.
    pub(super) fn read(
        &self,
        key: &str,
        window: Option<&pb::WindowSelector>,
    ) -> Result<pb::Value, ApiError> {
        if let Some(pb::WindowSelector {
            which: Some(pb::window_selector::Which::Range(_)),
        }) = window
        {
            return Err(ApiError::InvalidArgument(
                "a range of windows is read with BatchGet or Scan, one value per window".into(),
            ));
        }
        self.read_values(key, window)?
            .pop()
            .ok_or_else(|| ApiError::Internal(format!("no value read for {key:?}")))
    }

    /// What the key's partition holds of each remote region, and how old this node's
    /// copy of it is if this node no longer owns it.
    pub(super) fn fill_freshness(&self, value: &mut pb::Value, partition: i32) {
        self.fill_copy(value, partition);
        if let Some(f) = value.freshness.as_mut() {
            f.remotes = self
                .0
                .freshness
                .of(partition)
                .into_iter()
                .map(|(region, r)| pb::RemoteFreshness {
                    region: region.to_string(),
                    applied: Some(convert::hlc(r.applied)),
                    lag_ms: r.lag.as_millis() as u64,
                })
                .collect();
        }
    }

    /// Marks a value read from this node's copy of a partition it no longer owns.
    fn fill_copy(&self, value: &mut pb::Value, partition: i32) {
        if self.0.owned.owns(partition) {
            return;
        }
        if let Some(copy) = self.0.owned.copy_of(partition) {
            value.freshness.get_or_insert_default().copy = Some(pb::StaleCopy {
                age_ms: copy.age.as_millis() as u64,
                applied_offset: copy.applied.unwrap_or(-1),
            });
        }
    }

    /// `BatchGet`: the keys of this node's partitions read here, the others asked of their
    /// owners (one request per owner).
    pub(super) async fn batch_get_routed(
        &self,
        keys: Vec<String>,
        window: Option<pb::WindowSelector>,
        routed: bool,
    ) -> Result<pb::BatchGetResponse, ApiError> {
        let mut here = Vec::new();
        let mut elsewhere: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for key in keys {
            match self.route_read(&key, routed).await? {
                None => here.push(key),
                Some(node) => elsewhere.entry(node).or_default().push(key),
            }
        }
        // RocksDB reads: off the async threads (the lease group's Raft runs there)
        let handler = self.clone();
        let selector = window;
        let mut out = tokio::task::spawn_blocking(move || {
            let mut out = pb::BatchGetResponse::default();
            for key in here {
                match handler.read_values(&key, selector.as_ref()) {
                    Ok(v) => out.values.extend(v),
                    Err(ApiError::NotFound { .. }) => out.missing.push(key),
                    Err(e) => return Err(e),
                }
            }
            Ok(out)
        })
        .await
        .unwrap_or_else(|e| Err(ApiError::Internal(e.to_string())))?;
        for (node, keys) in elsewhere {
            let request = pb::BatchGetRequest { keys, window };
            let (mut client, request) = self.node_client(&node, request)?;
            let answer = self
                .routed_answer(node, client.batch_get(request).await)
                .await?;
            out.values.extend(answer.values);
            out.missing.extend(answer.missing);
        }
        Ok(out)
    }

    /// A page of `Scan`: this node's partitions read here; unless the request was routed
    /// here, the same page asked of every other owner, the pages merged in key order and
    /// cut to the limit (each owner's first `limit` keys after the token hold the merged
    /// page's).
    pub(super) async fn scan(
        &self,
        req: pb::ScanRequest,
        routed: bool,
    ) -> Result<pb::ScanResponse, ApiError> {
        let limit = match req.limit as usize {
            0 => SCAN_DEFAULT_LIMIT,
            n => n.min(SCAN_MAX_LIMIT),
        };
        // a token is the last key of the page before: under the prefix, or not ours
        if !req.page_token.is_empty()
            && (!req.page_token.starts_with(&req.prefix)
                || req.page_token.len() > self.0.config.ingest.max_key_bytes)
        {
            return Err(ApiError::InvalidArgument(format!(
                "page_token {:?} is not a key under prefix {:?}: pass back the next_page_token of the page before",
                req.page_token.chars().take(64).collect::<String>(),
                req.prefix
            )));
        }
        let (others, copies) = if routed {
            (BTreeSet::new(), BTreeSet::new())
        } else {
            self.read_sources(&req.prefix).await?
        };
        // the partitions owned here, and those no node is known to own whose copy this
        // node keeps
        let mut owned = self.0.owned.owned();
        owned.extend(copies);
        let (handler, request, read) = (self.clone(), req.clone(), owned.clone());
        let mut values =
            tokio::task::spawn_blocking(move || handler.scan_here(&read, &request, limit))
                .await
                .map_err(|e| ApiError::Internal(e.to_string()))??;
        let mut covered = owned;
        for node in others {
            let (mut client, request) = self.node_client(&node, req.clone())?;
            let theirs = self.routed_answer(node, client.scan(request).await).await?;
            values.extend(theirs.values);
            covered.extend(theirs.partitions);
        }
        // routes a moment old may miss a partition that just moved: a page without its
        // keys would look complete
        if !routed && let Some(&partition) = self.0.partitions.iter().find(|p| !covered.contains(p))
        {
            return Err(ApiError::NotOwner {
                key: req.prefix,
                partition,
                owner: None,
            });
        }
        // by key, a windowed key's windows oldest first: the first `limit` keys
        values.sort_by(|a, b| a.key.cmp(&b.key));
        let values = first_keys(values, limit);
        let next_page_token = if count_keys(&values) == limit {
            values.last().map(|v| v.key.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(pb::ScanResponse {
            values,
            next_page_token,
            partitions: covered.into_iter().collect(),
        })
    }

    /// This node's part of a `Scan` page: the first `limit` keys under the prefix after
    /// the token in `partitions`, each read as a `Get` reads it (a windowed key once, from
    /// its slices, with the request's windows).
    fn scan_here(
        &self,
        partitions: &BTreeSet<i32>,
        req: &pb::ScanRequest,
        limit: usize,
    ) -> Result<Vec<pb::Value>, ApiError> {
        let namespaces = &self.0.config.namespaces;
        let windowed = |key: &str| namespaces.lookup(key).and_then(|ns| ns.window).is_some();
        // after a windowed key: after every slice of it
        let mut after = match req.page_token.as_str() {
            "" => None,
            token if windowed(token) => Some(window::slice_key(token, u64::MAX)),
            token => Some(token.to_owned()),
        };
        let mut keys: Vec<(String, Option<CrdtValue>)> = Vec::new();
        loop {
            let page = self
                .0
                .store
                .scan_in(partitions, &req.prefix, after.as_deref(), limit)?;
            let full = page.len() == limit;
            after = page.last().map(|(k, _)| k.clone());
            for (stored, value) in page {
                let (home, slice) = window::split_slice_key(&stored);
                if slice.is_some() && windowed(home) {
                    if keys.last().is_none_or(|(k, _)| k != home) {
                        keys.push((home.to_owned(), None));
                    }
                } else {
                    keys.push((stored, Some(value)));
                }
            }
            if !full || keys.len() >= limit {
                break;
            }
        }
        keys.truncate(limit);
        let mut values = Vec::with_capacity(keys.len());
        for (key, stored) in keys {
            match stored {
                Some(v) => {
                    let mut value = convert::value(&key, v.crdt_type(), Some(&v))?;
                    self.fill_copy(&mut value, self.partition_of(&key));
                    values.push(value);
                }
                None => values.extend(self.read_values(&key, req.window.as_ref())?),
            }
        }
        Ok(values)
    }
}

/// The values of the first `limit` keys of `values` (sorted by key; a windowed key may
/// have several).
fn first_keys(mut values: Vec<pb::Value>, limit: usize) -> Vec<pb::Value> {
    let mut keys = 0;
    let mut end = values.len();
    for (i, v) in values.iter().enumerate() {
        if i == 0 || values[i - 1].key != v.key {
            keys += 1;
        }
        if keys > limit {
            end = i;
            break;
        }
    }
    values.truncate(end);
    values
}

/// How many keys `values` (sorted by key) hold.
fn count_keys(values: &[pb::Value]) -> usize {
    values
        .iter()
        .enumerate()
        .filter(|(i, v)| *i == 0 || values[i - 1].key != v.key)
        .count()
}
