//! The tonic services: [`serve`] puts `State`, `Admin`, health and reflection on the
//! listener, and the `State` and `Admin` impls are the glue: they read the request's
//! metadata (forwarded, routed), call the path that does the work, and record the
//! method's latency and error code.

use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpListener;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::{Api, ApiError, FORWARDED, Handler, ROUTED, observe};
use crate::pb;
use crate::pb::admin_server::{Admin, AdminServer};
use crate::pb::state_server::{State, StateServer};
use crate::security::Listener;
use crate::security::tls::incoming;

/// Serves the API on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    api: Arc<Api>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<StateServer<Handler>>().await;
    health.set_serving::<AdminServer<Handler>>().await;
    // stopping (asked to, or a part failed): health says so to clients still connected
    let shutdown = async move {
        shutdown.await;
        health.set_not_serving::<StateServer<Handler>>().await;
        health.set_not_serving::<AdminServer<Handler>>().await;
    };
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| {
            tracing::error!(error = %e, "reflection descriptors are invalid");
            e
        });
    let incoming = incoming(listener, api.tls.clone(), Listener::Api);
    let guard = api.guard.clone();
    let handler = Handler(api);
    let mut router = tonic::transport::Server::builder()
        .layer(guard)
        .add_service(health_service)
        .add_service(StateServer::new(handler.clone()))
        .add_service(AdminServer::new(handler));
    if let Ok(reflection) = reflection {
        router = router.add_service(reflection);
    }
    router
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

#[tonic::async_trait]
impl State for Handler {
    async fn update(
        &self,
        req: Request<pb::UpdateRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        let started = Instant::now();
        let forwarded = req.metadata().contains_key(FORWARDED);
        let routed = req.metadata().contains_key(ROUTED);
        observe(
            "update",
            started,
            Handler::update(self, req.into_inner(), forwarded, routed).await,
        )
        .map(Response::new)
    }

    async fn get(&self, req: Request<pb::GetRequest>) -> Result<Response<pb::Value>, Status> {
        let started = Instant::now();
        let routed = req.metadata().contains_key(ROUTED);
        let req = req.into_inner();
        // a leaseholder read only where the partition is owned, a replica read also from a
        // copy while no node of the region owns it
        let route = if req.leaseholder {
            self.route(&req.key, routed).await
        } else {
            self.route_read(&req.key, routed).await
        };
        let read = match route {
            Ok(Some(node)) => match self.node_client(&node, req) {
                Ok((mut client, request)) => {
                    let answer = client.get(request).await;
                    self.routed_answer(node, answer).await
                }
                Err(e) => Err(e),
            },
            Ok(None) if req.leaseholder => self.read_at_holder(&req.key).await,
            Ok(None) => self.read(&req.key, req.window.as_ref(), true),
            Err(e) => Err(e),
        };
        observe("get", started, read).map(Response::new)
    }

    async fn batch_get(
        &self,
        req: Request<pb::BatchGetRequest>,
    ) -> Result<Response<pb::BatchGetResponse>, Status> {
        let started = Instant::now();
        let routed = req.metadata().contains_key(ROUTED);
        let pb::BatchGetRequest { keys, window } = req.into_inner();
        let max = self.0.config.api.max_batch_keys;
        let result = if keys.len() > max {
            Err(ApiError::TooMuch(format!(
                "BatchGet asks for {} keys; api.max-batch-keys is {max}",
                keys.len()
            )))
        } else {
            self.batch_get_routed(keys, window, routed).await
        };
        observe("batch_get", started, result).map(Response::new)
    }

    async fn scan(
        &self,
        req: Request<pb::ScanRequest>,
    ) -> Result<Response<pb::ScanResponse>, Status> {
        let started = Instant::now();
        let routed = req.metadata().contains_key(ROUTED);
        let page = Handler::scan(self, req.into_inner(), routed).await;
        observe("scan", started, page).map(Response::new)
    }

    type WatchStream = ReceiverStream<Result<pb::Value, Status>>;

    /// This node's changes under the prefix and, unless the request was routed here, every
    /// other owner's (a routed `Watch` to each, merged). Partitions moving between the
    /// region's nodes end the stream with `UNAVAILABLE` (this node's owned set or the other
    /// owners changed, or another owner's stream ended): a moving partition's changes may
    /// be missed, so the client scans and watches again rather than miss them silently.
    async fn watch(
        &self,
        req: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let routed = req.metadata().contains_key(ROUTED);
        let prefix = req.into_inner().prefix;
        let stream = self.open_watch(prefix, routed).await?;
        Ok(Response::new(stream))
    }
}

#[tonic::async_trait]
impl Admin for Handler {
    async fn status(
        &self,
        _req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let started = Instant::now();
        observe("status", started, Handler::status(self).await).map(Response::new)
    }

    async fn checkpoint(
        &self,
        _req: Request<pb::CheckpointRequest>,
    ) -> Result<Response<pb::CheckpointResponse>, Status> {
        let started = Instant::now();
        observe("checkpoint", started, Handler::checkpoint(self).await).map(Response::new)
    }

    async fn savepoint(
        &self,
        _req: Request<pb::SavepointRequest>,
    ) -> Result<Response<pb::SavepointResponse>, Status> {
        let started = Instant::now();
        observe("savepoint", started, Handler::savepoint(self).await).map(Response::new)
    }

    async fn leases(
        &self,
        req: Request<pb::LeasesRequest>,
    ) -> Result<Response<pb::LeasesResponse>, Status> {
        let started = Instant::now();
        let listed = Handler::list_leases(self, req.into_inner()).await;
        observe("leases", started, listed).map(Response::new)
    }

    async fn route(
        &self,
        req: Request<pb::RouteRequest>,
    ) -> Result<Response<pb::RouteResponse>, Status> {
        let started = Instant::now();
        observe(
            "route",
            started,
            Handler::locate(self, req.into_inner()).await,
        )
        .map(Response::new)
    }

    async fn transfer_lease(
        &self,
        req: Request<pb::TransferLeaseRequest>,
    ) -> Result<Response<pb::TransferLeaseResponse>, Status> {
        let started = Instant::now();
        observe(
            "transfer_lease",
            started,
            Handler::transfer_lease(self, req.into_inner()).await,
        )
        .map(Response::new)
    }
}
