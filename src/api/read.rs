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
use std::sync::Arc;

use super::{ApiError, Handler, convert};
use crate::config::Ownership;
use crate::crdt::CrdtValue;
use crate::partition::{Held, PartitionHandle};
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
        // never from a copy: only the partition's owner has applied every acknowledged write
        self.read(key, None, false)
    }

    /// A key's values: one, or for a windowed key one per window `window` names; with
    /// `copies`, also from this node's copy of a partition it let go.
    fn read_values(
        &self,
        key: &str,
        window: Option<&pb::WindowSelector>,
        copies: bool,
    ) -> Result<Vec<pb::Value>, ApiError> {
        let ns =
            self.0.config.namespaces.lookup(key).ok_or_else(|| {
                ApiError::InvalidArgument(format!("key {key:?} is in no namespace"))
            })?;
        let partition = self.partition_of(key);
        let term = self.term_of(key, partition)?;
        let read = match &ns.window {
            Some(spec) => self.read_windows(key, spec, ns.crdt, window),
            None => self
                .0
                .store
                .get(key)
                .map_err(ApiError::from)
                .and_then(|state| convert::value(key, ns.crdt, state.as_ref()))
                .map(|mut value| {
                    self.fill_freshness(&mut value, partition);
                    vec![value]
                }),
        };
        self.answered_from(key, &term, copies, read)
    }

    /// The term of `partition` (for `key`) a read answers from, noted before the store is
    /// read ([`Partitions::term_of`](crate::partition::Partitions::term_of)): owned here,
    /// or let go with its copy kept; neither is refused as moving.
    pub(super) fn term_of(
        &self,
        key: &str,
        partition: i32,
    ) -> Result<Arc<PartitionHandle>, ApiError> {
        self.0
            .owned
            .term_of(partition)
            .ok_or_else(|| ApiError::NotOwner {
                key: key.to_string(),
                partition,
                owner: None,
            })
    }

    /// What was `read` from `term` once it is read: as it is while the term is owned here;
    /// with `copies`, marked with how old the copy is while the term is a copy kept here;
    /// otherwise refused as moving (the copy was forgotten to be caught up, or the term
    /// let go, since the read began: what it read may be half rebuilt).
    pub(super) fn answered_from(
        &self,
        key: &str,
        term: &Arc<PartitionHandle>,
        copies: bool,
        read: Result<Vec<pb::Value>, ApiError>,
    ) -> Result<Vec<pb::Value>, ApiError> {
        match self.0.owned.holds(term) {
            Held::Owned => read,
            Held::Copy(copy) if copies => {
                let mut values = read?;
                for value in &mut values {
                    value.freshness.get_or_insert_default().copy = Some(pb::StaleCopy {
                        age_ms: copy.age.as_millis() as u64,
                        applied_offset: copy.applied.unwrap_or(-1),
                    });
                }
                Ok(values)
            }
            Held::Copy(_) | Held::Gone => Err(ApiError::NotOwner {
                key: key.to_string(),
                partition: term.partition,
                owner: None,
            }),
        }
    }

    /// One value of `key`: a windowed key's one window, not a range; with `copies`, also
    /// from this node's copy of a partition it let go.
    pub(super) fn read(
        &self,
        key: &str,
        window: Option<&pb::WindowSelector>,
        copies: bool,
    ) -> Result<pb::Value, ApiError> {
        if let Some(pb::WindowSelector {
            which: Some(pb::window_selector::Which::Range(_)),
        }) = window
        {
            return Err(ApiError::InvalidArgument(
                "a range of windows is read with BatchGet or Scan, one value per window".into(),
            ));
        }
        self.read_values(key, window, copies)?
            .pop()
            .ok_or_else(|| ApiError::Internal(format!("no value read for {key:?}")))
    }

    /// What the key's partition holds of each remote region.
    pub(super) fn fill_freshness(&self, value: &mut pb::Value, partition: i32) {
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
                match handler.read_values(&key, selector.as_ref(), true) {
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
        // the other owners' pages first: a copy's partition one of them answered for (the
        // routes were a moment old) is theirs, not read here
        let mut values = Vec::new();
        let mut covered = BTreeSet::new();
        for node in others {
            let (mut client, request) = self.node_client(&node, req.clone())?;
            let theirs = self.routed_answer(node, client.scan(request).await).await?;
            values.extend(theirs.values);
            covered.extend(theirs.partitions);
        }
        // the partitions owned here, and those no node is known to own whose copy this
        // node keeps
        let mut here = self.0.owned.owned();
        here.extend(copies.iter().filter(|p| !covered.contains(p)));
        let (handler, request, read) = (self.clone(), req.clone(), here.clone());
        let mine = tokio::task::spawn_blocking(move || handler.scan_here(&read, &request, limit))
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))??;
        values.extend(mine);
        covered.extend(here);
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
        // the term each partition is read from, noted before anything of it is read
        let terms = (partitions.iter())
            .map(|&p| Ok((p, self.term_of(&req.prefix, p)?)))
            .collect::<Result<BTreeMap<i32, _>, ApiError>>()?;
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
        let mut read: BTreeMap<i32, Vec<pb::Value>> = BTreeMap::new();
        for (key, stored) in keys {
            let value = match stored {
                Some(v) => vec![convert::value(&key, v.crdt_type(), Some(&v))?],
                None => self.read_values(&key, req.window.as_ref(), true)?,
            };
            read.entry(self.partition_of(&key))
                .or_default()
                .extend(value);
        }
        // each partition's part as its term is now (the listing came from it too)
        let mut values = Vec::new();
        for (p, term) in &terms {
            let part = read.remove(p).unwrap_or_default();
            values.extend(self.answered_from(&req.prefix, term, true, Ok(part))?);
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
