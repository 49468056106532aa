//! The `[api]` section: the gRPC and metrics listeners, the request limits, and who may
//! call what. Whether a listener may serve plaintext is decided with `[tls]` here.

use std::net::SocketAddr;

use serde::Deserialize;

use super::security::{self, RawAuth};
use super::{AuthConfig, ConfigError, TlsConfig, invalid, parse_addr};

#[derive(Clone, Debug)]
pub struct ApiConfig {
    pub grpc_listen: SocketAddr,
    /// The gRPC address clients reach this node at (`Admin/Route` answers it); `None`:
    /// the address the listener is bound to.
    pub advertise: Option<String>,
    pub metrics_listen: SocketAddr,
    /// Most keys one `BatchGet` may ask for.
    pub max_batch_keys: usize,
    /// Most `Watch` streams open at once.
    pub max_watchers: usize,
    /// Who may call what.
    pub auth: AuthConfig,
    /// The API and metrics listeners serve plaintext even with `[tls]` (loopback only):
    /// a process whose lease group runs on TLS behind a local proxy or sidecar.
    pub plaintext: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct RawApi {
    grpc_listen: String,
    #[serde(default)]
    advertise: Option<String>,
    metrics_listen: String,
    #[serde(default = "default_max_batch_keys")]
    max_batch_keys: usize,
    #[serde(default = "default_max_watchers")]
    max_watchers: usize,
    auth: Option<RawAuth>,
    #[serde(default)]
    plaintext: bool,
}

fn default_max_batch_keys() -> usize {
    1000
}
fn default_max_watchers() -> usize {
    1024
}

impl RawApi {
    /// The request limits. Checked before the other sections; the listeners and the
    /// authorization are validated later, by [`Self::validate`].
    pub(super) fn check_limits(&self) -> Result<(), ConfigError> {
        if self.max_batch_keys == 0 || self.max_watchers == 0 {
            return Err(invalid(
                "api.max-batch-keys",
                "request limits must be at least 1",
            ));
        }
        Ok(())
    }

    /// The section, with its listeners and authorization validated (its limits were
    /// checked by [`Self::check_limits`]). `lease_listen`, the lease group's listener,
    /// follows the same plaintext rule as the API's.
    pub(super) fn validate(
        self,
        tls: Option<&TlsConfig>,
        lease_listen: Option<SocketAddr>,
        allow_plaintext: bool,
    ) -> Result<ApiConfig, ConfigError> {
        let grpc_listen = parse_addr("api.grpc-listen", &self.grpc_listen)?;
        let metrics_listen = parse_addr("api.metrics-listen", &self.metrics_listen)?;
        let mut listeners = vec![
            ("api.grpc-listen", grpc_listen),
            ("api.metrics-listen", metrics_listen),
        ];
        listeners.extend(lease_listen.map(|listen| ("lease.listen", listen)));
        security::check_plaintext(tls, allow_plaintext, &listeners)?;
        let api_tls = tls.filter(|_| !self.plaintext);
        if self.plaintext {
            security::check_plaintext(None, allow_plaintext, &listeners[..2])?;
        }
        let auth = security::api_auth(self.auth, api_tls, grpc_listen)?;
        Ok(ApiConfig {
            grpc_listen,
            advertise: self.advertise.filter(|a| !a.is_empty()),
            metrics_listen,
            max_batch_keys: self.max_batch_keys,
            max_watchers: self.max_watchers,
            auth,
            plaintext: self.plaintext,
        })
    }
}
