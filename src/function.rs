//! User functions over gRPC (`geostate.v1.Function`): a sidecar process beside a region's
//! nodes, in any language, computing derived results for batches of final windows. The
//! pricer calls one for the surge multipliers (`[pricing] function`); the node checks
//! its health (`Describe`) for `Admin/Status`.
//!
//! ```text
//!  pricer round ─► every ready (geohash, window) ─► chunks of MAX_BATCH ─► Compute
//!    ─► one value per input, checked (count, range) ─► compare-and-set per window
//!  a timeout, a crash, an error or garbage ─► the chunk's geohashes stay pending, tried
//!    again after a backoff (1 s, doubling to 30 s); the other chunks go on
//! ```

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

use crate::metrics as m;
use crate::pb;
use crate::pb::function_client::FunctionClient;

/// The most inputs in one `Compute` call (a bigger batch is split).
pub const MAX_BATCH: usize = 1_000;

/// Why a batch got no results.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FunctionError {
    #[error("the function at {addr} did not answer within {timeout:?}")]
    Timeout { addr: String, timeout: Duration },
    #[error("the function at {addr} cannot be reached: {reason}")]
    Unavailable { addr: String, reason: String },
    #[error("the function at {addr} refused the batch: {reason}")]
    Refused { addr: String, reason: String },
    #[error("the function at {addr} answered garbage: {reason}")]
    Invalid { addr: String, reason: String },
}

impl FunctionError {
    /// The `outcome` label of its call.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::Timeout { .. } => "timeout",
            Self::Unavailable { .. } => "unavailable",
            Self::Refused { .. } => "refused",
            Self::Invalid { .. } => "invalid",
        }
    }
}

/// A function sidecar at `unix:///path/to.sock` or `http://host:port`.
#[derive(Clone)]
pub struct Sidecar {
    /// The function's name, as its `Describe` must answer it.
    name: String,
    addr: String,
    client: FunctionClient<Channel>,
    timeout: Duration,
}

impl Sidecar {
    /// A lazily made connection to `addr` (an error only for an address that is neither
    /// form).
    pub fn new(name: &str, addr: &str, timeout: Duration) -> anyhow::Result<Self> {
        let channel = match addr.strip_prefix("unix://") {
            Some(path) => {
                let path = PathBuf::from(path);
                // the URI is unused: every connection goes to the socket
                Endpoint::from_static("http://function.sock").connect_with_connector_lazy(
                    tower::service_fn(move |_| {
                        let path = path.clone();
                        async move {
                            let stream = tokio::net::UnixStream::connect(path).await?;
                            Ok::<_, std::io::Error>(TokioIo::new(stream))
                        }
                    }),
                )
            }
            None if addr.starts_with("http://") => Endpoint::from_shared(addr.to_owned())
                .map_err(|e| anyhow::anyhow!("function address {addr:?}: {e}"))?
                .connect_lazy(),
            None => anyhow::bail!(
                "function address {addr:?} is neither unix:///path nor http://host:port"
            ),
        };
        Ok(Self {
            name: name.to_owned(),
            addr: addr.to_owned(),
            client: FunctionClient::new(channel),
            timeout,
        })
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    fn failed(&self, status: tonic::Status) -> FunctionError {
        let addr = self.addr.clone();
        match status.code() {
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => FunctionError::Timeout {
                addr,
                timeout: self.timeout,
            },
            tonic::Code::Unavailable | tonic::Code::Unknown => FunctionError::Unavailable {
                addr,
                reason: status.message().to_owned(),
            },
            _ => FunctionError::Refused {
                addr,
                reason: format!("{:?}: {}", status.code(), status.message()),
            },
        }
    }

    /// A call that ran out of time reached a slow sidecar, or none: where nothing
    /// takes a connection any more (a crashed sidecar, whose old connection the channel
    /// is still remaking), the sidecar is unavailable.
    async fn timed_out(&self) -> FunctionError {
        let refused = match self.addr.strip_prefix("unix://") {
            Some(path) => tokio::net::UnixStream::connect(path).await.is_err(),
            None => {
                let hostport = self.addr.trim_start_matches("http://");
                tokio::net::TcpStream::connect(hostport).await.is_err()
            }
        };
        match refused {
            true => FunctionError::Unavailable {
                addr: self.addr.clone(),
                reason: "nothing takes a connection there".into(),
            },
            false => FunctionError::Timeout {
                addr: self.addr.clone(),
                timeout: self.timeout,
            },
        }
    }

    /// What the sidecar says it is; refused when it serves another function.
    pub async fn describe(&self) -> Result<pb::DescribeResponse, FunctionError> {
        let mut request = tonic::Request::new(pb::DescribeRequest {});
        request.set_timeout(self.timeout);
        let described = (self.client.clone().describe(request).await)
            .map_err(|s| self.failed(s))?
            .into_inner();
        if described.name != self.name {
            return Err(FunctionError::Invalid {
                addr: self.addr.clone(),
                reason: format!("it serves {:?}, not {:?}", described.name, self.name),
            });
        }
        Ok(described)
    }

    /// One call for `inputs` (at most [`MAX_BATCH`]): a value per input, in order, each
    /// checked by `valid`. Counted in `geostate_function_calls_total` and timed.
    pub async fn compute(
        &self,
        params: &[(&str, f64)],
        inputs: Vec<pb::FunctionInput>,
        valid: impl Fn(i64) -> bool,
    ) -> Result<Vec<i64>, FunctionError> {
        let count = inputs.len();
        let started = Instant::now();
        let result = self.call(params, inputs, valid).await;
        let outcome = result
            .as_ref()
            .map_or_else(FunctionError::outcome, |_| "ok");
        let name = self.name.clone();
        metrics::counter!(m::FUNCTION_CALLS, "function" => name.clone(), "outcome" => outcome)
            .increment(1);
        metrics::counter!(m::FUNCTION_INPUTS, "function" => name.clone()).increment(count as u64);
        metrics::histogram!(m::FUNCTION_CALL_SECONDS, "function" => name)
            .record(started.elapsed().as_secs_f64());
        result
    }

    async fn call(
        &self,
        params: &[(&str, f64)],
        inputs: Vec<pb::FunctionInput>,
        valid: impl Fn(i64) -> bool,
    ) -> Result<Vec<i64>, FunctionError> {
        let count = inputs.len();
        let mut request = tonic::Request::new(pb::ComputeRequest {
            function: self.name.clone(),
            params: params.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            inputs,
        });
        request.set_timeout(self.timeout);
        let mut client = self.client.clone();
        let answer = match tokio::time::timeout(self.timeout, client.compute(request)).await {
            Ok(Ok(answer)) => answer.into_inner(),
            Ok(Err(status)) => match self.failed(status) {
                FunctionError::Timeout { .. } => return Err(self.timed_out().await),
                e => return Err(e),
            },
            Err(_) => return Err(self.timed_out().await),
        };
        let invalid = |reason: String| FunctionError::Invalid {
            addr: self.addr.clone(),
            reason,
        };
        if answer.results.len() != count {
            return Err(invalid(format!(
                "{} results for {count} inputs",
                answer.results.len()
            )));
        }
        let values: Vec<i64> = answer.results.iter().map(|r| r.value).collect();
        if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| !valid(**v)) {
            return Err(invalid(format!("result {i} is {v}, out of range")));
        }
        Ok(values)
    }
}

/// A sidecar's health as the node last checked it (`Admin/Status`).
#[derive(Clone)]
pub struct Health {
    sidecar: Sidecar,
    last: Arc<Mutex<Option<Checked>>>,
}

#[derive(Clone)]
struct Checked {
    at: Instant,
    answer: Result<(pb::DescribeResponse, Duration), FunctionError>,
}

/// How often the node checks a sidecar.
const CHECK_EVERY: Duration = Duration::from_secs(2);

impl Health {
    pub fn new(sidecar: Sidecar) -> Self {
        Self {
            sidecar,
            last: Arc::default(),
        }
    }

    /// Checks the sidecar every [`CHECK_EVERY`] until dropped.
    pub async fn run(self) {
        loop {
            let started = Instant::now();
            let answer = (self.sidecar.describe().await).map(|d| (d, started.elapsed()));
            metrics::gauge!(m::FUNCTION_UP, "function" => self.sidecar.name.clone())
                .set(if answer.is_ok() { 1.0 } else { 0.0 });
            if let Err(e) = &answer {
                tracing::debug!(error = %e, "function health check");
            }
            *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(Checked {
                at: Instant::now(),
                answer,
            });
            tokio::time::sleep(CHECK_EVERY).await;
        }
    }

    /// For `Admin/Status`.
    pub fn status(&self) -> pb::FunctionStatus {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut status = pb::FunctionStatus {
            name: self.sidecar.name.clone(),
            addr: self.sidecar.addr.clone(),
            ..Default::default()
        };
        if let Some(checked) = last {
            status.checked_ms_ago = checked.at.elapsed().as_millis() as u64;
            match checked.answer {
                Ok((described, took)) => {
                    status.healthy = true;
                    status.version = described.version;
                    status.runtime = described.runtime;
                    status.latency_us = took.as_micros() as u64;
                }
                Err(e) => status.error = e.to_string(),
            }
        } else {
            status.error = "not checked yet".into();
        }
        status
    }
}
