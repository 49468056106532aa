//! The `[api]` section: the gRPC and metrics listeners, the request limits, and who may
//! call what. Whether a listener may serve plaintext is decided with `[tls]` here.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::Deserialize;

use super::security::{self, RawAuth};
use super::{AuthConfig, ConfigError, Role, TlsConfig, invalid, parse_addr};

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
    /// Per role, what one caller of it may call (`[api.limits.<role>]`; a role not named
    /// is not limited).
    pub limits: BTreeMap<Role, CallLimit>,
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
    limits: BTreeMap<Role, RawCallLimit>,
    #[serde(default)]
    plaintext: bool,
}

/// What one caller of a role may call: a token bucket of `rate` calls per second holding
/// up to `burst`, and at most `concurrency` calls in flight.
#[derive(Clone, Debug, PartialEq)]
pub struct CallLimit {
    pub rate: f64,
    pub burst: f64,
    pub concurrency: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawCallLimit {
    rate: f64,
    /// Default: one second's worth of `rate` (at least 1).
    burst: Option<f64>,
    concurrency: Option<usize>,
}

impl RawCallLimit {
    fn validate(self, role: Role) -> Result<CallLimit, ConfigError> {
        let role = role.name();
        if !(self.rate.is_finite() && self.rate >= 0.001) {
            let why = format!("{role}.rate must be at least 0.001 (calls per second)");
            return Err(invalid("api.limits", why));
        }
        let burst = self.burst.unwrap_or(self.rate.max(1.0));
        if !(burst.is_finite() && burst >= 1.0) {
            return Err(invalid(
                "api.limits",
                format!("{role}.burst must be at least 1"),
            ));
        }
        if self.concurrency.is_some_and(|n| n == 0 || n > 1_000_000) {
            let why = format!("{role}.concurrency must be 1 to 1,000,000");
            return Err(invalid("api.limits", why));
        }
        Ok(CallLimit {
            rate: self.rate,
            burst,
            concurrency: self.concurrency,
        })
    }
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
        let limits = (self.limits.into_iter())
            .map(|(role, limit)| Ok((role, limit.validate(role)?)))
            .collect::<Result<_, ConfigError>>()?;
        Ok(ApiConfig {
            grpc_listen,
            advertise: self.advertise.filter(|a| !a.is_empty()),
            metrics_listen,
            max_batch_keys: self.max_batch_keys,
            max_watchers: self.max_watchers,
            auth,
            limits,
            plaintext: self.plaintext,
        })
    }
}
