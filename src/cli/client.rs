//! How a client command reaches its node: a gRPC channel to `--addr`, over TLS when
//! `--ca` is given, every call carrying the bearer token of `--token-file`.

use anyhow::Context;

use super::Node;
use crate::pb::admin_client::AdminClient;
use crate::pb::state_client::StateClient;

/// Adds `authorization: Bearer <token>` to every call of a client.
#[derive(Clone)]
pub(super) struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        Ok(request)
    }
}

pub(super) type Channel = tonic::codegen::InterceptedService<tonic::transport::Channel, Bearer>;

impl Node {
    /// A channel to the node, over TLS with `--ca`, carrying the token of `--token-file`.
    pub(super) async fn channel(&self) -> anyhow::Result<Channel> {
        let channel = match &self.ca {
            None => {
                tonic::transport::Endpoint::from_shared(self.addr.clone())?
                    .connect()
                    .await?
            }
            Some(ca) => {
                let identity = self.cert.as_deref().zip(self.cert_key.as_deref());
                let tls = crate::security::tls::client(ca, identity)?;
                let timeout = std::time::Duration::from_secs(10);
                crate::security::tls::connect_with(&self.addr, tls, timeout).await?
            }
        };
        let token = match &self.token_file {
            None => None,
            Some(file) => {
                let text = std::fs::read_to_string(file)
                    .with_context(|| format!("reading the token file {}", file.display()))?;
                let token = text.lines().next().unwrap_or_default().trim();
                // the token itself is never part of an error
                let header = format!("Bearer {token}").parse().map_err(|_| {
                    anyhow::anyhow!("the token in {} is not ASCII text", file.display())
                })?;
                Some(header)
            }
        };
        Ok(tonic::codegen::InterceptedService::new(
            channel,
            Bearer(token),
        ))
    }

    pub(super) async fn state(&self) -> anyhow::Result<StateClient<Channel>> {
        Ok(StateClient::new(self.channel().await?))
    }

    pub(super) async fn admin(&self) -> anyhow::Result<AdminClient<Channel>> {
        Ok(AdminClient::new(self.channel().await?))
    }
}
