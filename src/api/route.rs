//! Routing inside the region: which of its nodes owns a key's partition (read from the
//! region's Kafka group, kept for a moment), and requests sent on to that node, marked
//! routed so they are never routed twice.
//!
//! ```text
//!  key ──partition_of──► partition ──owned here?──► answer here
//!                                  └──owner_of (group)──► node_client ──► owning node
//! ```

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use tonic::{Request, Response, Status};

use super::{ApiError, Handler, ROUTED};
use crate::pb;

/// How long a read of the region's group (which node owns which partition) is used.
const ROUTES_FOR: Duration = Duration::from_secs(1);

impl Handler {
    /// The key's partition of the updates topic.
    pub(super) fn partition_of(&self, key: &str) -> i32 {
        let partitions = i32::try_from(self.0.partitions.len()).unwrap_or(i32::MAX);
        crate::log::partition_of(key.as_bytes(), partitions)
    }

    /// The node of this region owning `partition`: this one (`None`), or another's address
    /// from the region's group (read at most every [`ROUTES_FOR`], and again when it names
    /// no owner or this node, or a routed request was answered `UNAVAILABLE`; while the
    /// group rebalances, the routes it last read stand:
    /// a node that no longer owns the partition answers so).
    async fn owner_of(&self, partition: i32) -> Option<String> {
        let api = &self.0;
        if api.owned.owns(partition) {
            return None;
        }
        let mut routes = api.routes.lock().await;
        let known = routes
            .1
            .get(&partition)
            .filter(|owner| **owner != api.address);
        let fresh = routes.0.is_some_and(|at| at.elapsed() < ROUTES_FOR);
        if known.is_none() || !fresh {
            let group = crate::keeper::group_id(&api.config);
            let topic = &api.config.kafka.updates_topic;
            if let Ok(Some(read)) =
                crate::log::membership::owners(&api.config.kafka, &group, topic).await
            {
                *routes = (Some(Instant::now()), read);
            }
        }
        routes
            .1
            .get(&partition)
            .filter(|owner| **owner != api.address)
            .cloned()
    }

    /// Where a request for `key` is answered: here (`Ok(None)`), or at the address of the
    /// node owning its partition (a request routed once already is never routed again).
    pub(super) async fn route(&self, key: &str, routed: bool) -> Result<Option<String>, ApiError> {
        let partition = self.partition_of(key);
        if self.0.owned.owns(partition) {
            return Ok(None);
        }
        let owner = self.owner_of(partition).await;
        match owner {
            Some(owner) if !routed => Ok(Some(owner)),
            owner => Err(ApiError::NotOwner {
                key: key.to_string(),
                partition,
                owner,
            }),
        }
    }

    /// The answer of the node at `node` to a routed request. An `UNAVAILABLE` one (the
    /// partition moved, or the node is gone) makes the next route read the group again
    /// rather than trust routes up to [`ROUTES_FOR`] old.
    pub(super) async fn routed_answer<T>(
        &self,
        node: String,
        answer: Result<Response<T>, Status>,
    ) -> Result<T, ApiError> {
        match answer {
            Ok(answer) => Ok(answer.into_inner()),
            Err(status) => {
                if status.code() == tonic::Code::Unavailable {
                    self.0.routes.lock().await.0 = None;
                }
                Err(ApiError::Routed { node, status })
            }
        }
    }

    /// A client of the region's node at `addr`, and a request to it marked routed.
    pub(super) fn node_client<T>(
        &self,
        addr: &str,
        req: T,
    ) -> Result<
        (
            pb::state_client::StateClient<tonic::transport::Channel>,
            Request<T>,
        ),
        ApiError,
    > {
        let channel = self.0.peers.get(addr).map_err(ApiError::Internal)?;
        let mut request = Request::new(req);
        if let Ok(node) = self.0.address.parse() {
            request.metadata_mut().insert(ROUTED, node);
        }
        Ok((pb::state_client::StateClient::new(channel), request))
    }

    /// The other nodes of this region owning some partition, each once; a partition no
    /// node owns (it moves) fails the call: a page without its keys would look complete.
    pub(super) async fn other_owners(&self, key: &str) -> Result<BTreeSet<String>, ApiError> {
        let mut nodes = BTreeSet::new();
        for &partition in &self.0.partitions {
            if self.0.owned.owns(partition) {
                continue;
            }
            match self.owner_of(partition).await {
                Some(node) => {
                    nodes.insert(node);
                }
                None => {
                    return Err(ApiError::NotOwner {
                        key: key.to_string(),
                        partition,
                        owner: None,
                    });
                }
            }
        }
        Ok(nodes)
    }

    /// The key's partition and the node of this region owning it (UNAVAILABLE while it
    /// moves and no node owns it).
    pub(super) async fn locate(
        &self,
        req: pb::RouteRequest,
    ) -> Result<pb::RouteResponse, ApiError> {
        if req.key.is_empty() {
            return Err(ApiError::InvalidArgument("key is empty".into()));
        }
        let api = &self.0;
        let partition = self.partition_of(&req.key);
        let node = match self.owner_of(partition).await {
            None if api.owned.owns(partition) => api.address.clone(),
            Some(owner) => owner,
            None => {
                return Err(ApiError::NotOwner {
                    key: req.key,
                    partition,
                    owner: None,
                });
            }
        };
        Ok(pb::RouteResponse {
            partition,
            key: req.key,
            partitions: i32::try_from(api.partitions.len()).unwrap_or(i32::MAX),
            region: api.config.region.to_string(),
            node,
        })
    }
}
