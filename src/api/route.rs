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

/// How long a read of the region's group (which node owns which partition) is used, and
/// how often the group is asked at most.
const ROUTES_FOR: Duration = Duration::from_secs(1);
/// How long a request waits for the group's answer while the region's Kafka does not
/// answer (`log::reach`; the ask goes on without it, and its answer is kept): the routes
/// last read stand meanwhile. Otherwise a request waits for the answer, however long
/// Kafka takes.
const ROUTES_WAIT: Duration = Duration::from_millis(500);

impl Handler {
    /// The key's partition of the updates topic.
    pub(super) fn partition_of(&self, key: &str) -> i32 {
        let partitions = i32::try_from(self.0.partitions.len()).unwrap_or(i32::MAX);
        crate::log::partition_of(key.as_bytes(), partitions)
    }

    /// The node of this region owning `partition`: this one (`None`), or another's address
    /// from the region's group. The group is asked when the routes name no owner or this
    /// node, or a routed request was answered `UNAVAILABLE`, and refreshed when they are
    /// older than [`ROUTES_FOR`] (at most that often): one ask at a time, on a task of its
    /// own, never under the routes' lock, waited for until it ends (while the region's
    /// Kafka does not answer, at most [`ROUTES_WAIT`] from its start; a later answer is
    /// kept for the next route). While the group rebalances or does not answer, the routes
    /// it last gave stand: a node that no longer owns the partition answers so.
    async fn owner_of(&self, partition: i32) -> Option<String> {
        let api = &self.0;
        if api.owned.owns(partition) {
            return None;
        }
        let mut routes = api.routes.lock().await;
        let known = owner_in(&routes, partition, api).is_some();
        let fresh = routes.read_at.is_some_and(|at| at.elapsed() < ROUTES_FOR);
        if !known || !fresh {
            let mut asked = routes.asked.subscribe();
            // known routes are refreshed at most every ROUTES_FOR; none known, at once
            let recently = routes.asked_at.is_some_and(|at| at.elapsed() < ROUTES_FOR);
            if !routes.asking && (!known || !recently) {
                (routes.asking, routes.asked_at) = (true, Some(Instant::now()));
                tokio::spawn(read_routes(api.clone()));
            }
            // an ask waited for until it ends, or at most ROUTES_WAIT from its start while
            // the region's Kafka does not answer
            let down = (api.kafka.as_ref()).is_some_and(|reachable| !*reachable.borrow());
            let wait = match down {
                false => crate::log::METADATA_TIMEOUT + ROUTES_WAIT,
                true => ROUTES_WAIT,
            };
            let left = (routes.asked_at).and_then(|at| wait.checked_sub(at.elapsed()));
            if let (true, Some(left)) = (routes.asking, left) {
                drop(routes);
                let _ = tokio::time::timeout(left, asked.changed()).await;
                routes = api.routes.lock().await;
            }
        }
        owner_in(&routes, partition, api)
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

    /// Where a replica read of `key` is answered: as [`Handler::route`], but here also
    /// when no node of the region is known to own the key's partition and this node keeps
    /// its copy from owning it (`Partitions::copy_of`): the answer then says how old the
    /// copy is. Never for a leaseholder read or a write.
    pub(super) async fn route_read(
        &self,
        key: &str,
        routed: bool,
    ) -> Result<Option<String>, ApiError> {
        match self.route(key, routed).await {
            Err(ApiError::NotOwner {
                partition,
                owner: None,
                ..
            }) if self.0.owned.copy_of(partition).is_some() => Ok(None),
            routed => routed,
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
                    let mut routes = self.0.routes.lock().await;
                    (routes.read_at, routes.asked_at) = (None, None);
                    // a node that cannot be reached (its connection failed: gone) owns
                    // nothing until the group names it again
                    if std::error::Error::source(&status).is_some() {
                        routes.owners.retain(|_, owner| *owner != node);
                    }
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
    /// node owns (it moves) fails the call: a stream without its keys would look whole.
    pub(super) async fn other_owners(&self, key: &str) -> Result<BTreeSet<String>, ApiError> {
        let (nodes, copies) = self.read_sources(key).await?;
        match copies.first() {
            Some(&partition) => Err(ApiError::NotOwner {
                key: key.to_string(),
                partition,
                owner: None,
            }),
            None => Ok(nodes),
        }
    }

    /// Where the partitions this node does not own are read: the other nodes of this
    /// region owning some, each once, and the partitions no node is known to own whose
    /// copy this node keeps (`Partitions::copy_of`). Any other partition no node owns (it
    /// moves) fails the call: a page without its keys would look complete.
    pub(super) async fn read_sources(
        &self,
        key: &str,
    ) -> Result<(BTreeSet<String>, BTreeSet<i32>), ApiError> {
        let (mut nodes, mut copies) = (BTreeSet::new(), BTreeSet::new());
        for &partition in &self.0.partitions {
            if self.0.owned.owns(partition) {
                continue;
            }
            match self.owner_of(partition).await {
                Some(node) => {
                    nodes.insert(node);
                }
                None if self.0.owned.copy_of(partition).is_some() => {
                    copies.insert(partition);
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
        Ok((nodes, copies))
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

/// The other node `routes` name as the owner of `partition`, unless this node owned it
/// since they were read (its copy was let go after: they are older than that).
fn owner_in(routes: &super::RouteTable, partition: i32, api: &super::Api) -> Option<String> {
    let owner = routes.owners.get(&partition)?;
    let read_before_owned = |age| routes.read_at.is_none_or(|at| at.elapsed() > age);
    let stale = (api.owned.copy_of(partition)).is_some_and(|c| read_before_owned(c.age));
    (*owner != api.address && !stale).then(|| owner.clone())
}

/// Reads which node of the region owns which partition from the region's group, into
/// `api.routes` (kept as they were if the group cannot be read or rebalances).
async fn read_routes(api: std::sync::Arc<super::Api>) {
    let group = crate::keeper::group_id(&api.config);
    let (kafka, topic) = (&api.config.kafka, &api.config.kafka.updates_topic);
    let wait = crate::log::METADATA_TIMEOUT;
    let read = crate::log::membership::owners(kafka, &group, topic, wait).await;
    let mut routes = api.routes.lock().await;
    if let Ok(Some(read)) = read {
        routes.read_at = Some(Instant::now());
        routes.owners = read;
    }
    routes.asking = false;
    routes.asked.send_modify(|n| *n += 1);
}
