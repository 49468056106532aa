//! TLS for every listener and every client of a process, from its `[tls]` section: rustls
//! (aws-lc) on both sides, the files read again on SIGHUP or when they change, and each
//! connection accepted with the configuration current then (so a renewed certificate
//! takes over without a restart; open connections keep theirs). A peer's identity is its
//! certificate's common name, checked against the CA at the handshake.
//!
//! tonic's own TLS feature fixes its configuration when the server starts and hides the
//! client configuration; this wraps the sockets instead (`incoming` for
//! `serve_with_incoming`, `connect` for channels), which gives reloading, a minimum
//! version, and the caller's identity as a request extension ([`Caller`]).

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use hyper_util::rt::TokioIo;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig, SupportedProtocolVersion};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::config::{TlsConfig, TlsVersion};
use crate::metrics as m;

/// Longest a client may take to complete its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the files are checked for a change (SIGHUP checks at once).
const RELOAD_CHECK: Duration = Duration::from_secs(5);
/// Handshaken connections waiting for the server to take them.
const ACCEPTED_QUEUE: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error("TLS configuration: {0}")]
    Rustls(String),
}

fn file_error(path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// What a listener serves, which decides its handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// The region API (HTTP/2): a client certificate is optional (a caller may present a
    /// bearer token instead), but checked against the CA when presented.
    Api,
    /// The lease group (HTTP/2): only a caller with a certificate from the CA.
    Lease,
    /// The metrics endpoint (HTTP/1.1): certificates optional.
    Metrics,
}

impl Listener {
    fn name(self) -> &'static str {
        match self {
            Listener::Api => "api",
            Listener::Lease => "lease",
            Listener::Metrics => "metrics",
        }
    }
}

/// The files of a `[tls]` section as loaded last.
struct Loaded {
    /// Modification times of cert, key and CA when read.
    stamps: [Option<SystemTime>; 3],
    api: Arc<ServerConfig>,
    lease: Arc<ServerConfig>,
    metrics: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

/// A process's TLS configuration, reloadable; cheap to clone.
#[derive(Clone)]
pub struct Tls(Arc<Shared>);

struct Shared {
    config: TlsConfig,
    loaded: RwLock<Loaded>,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn versions(min: TlsVersion) -> &'static [&'static SupportedProtocolVersion] {
    static FROM_1_2: [&SupportedProtocolVersion; 2] =
        [&rustls::version::TLS13, &rustls::version::TLS12];
    static FROM_1_3: [&SupportedProtocolVersion; 1] = [&rustls::version::TLS13];
    match min {
        TlsVersion::V1_2 => &FROM_1_2,
        TlsVersion::V1_3 => &FROM_1_3,
    }
}

fn stamp(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "holds no PEM certificate"));
    }
    Ok(certs)
}

fn rustls_error(e: impl std::fmt::Display) -> TlsError {
    TlsError::Rustls(e.to_string())
}

fn load(config: &TlsConfig) -> Result<Loaded, TlsError> {
    let stamps = [stamp(&config.cert), stamp(&config.key), stamp(&config.ca)];
    let certs = read_certs(&config.cert)?;
    // the key's parse error never quotes the file: it is a secret
    let key = PrivateKeyDer::from_pem_file(&config.key)
        .map_err(|_| file_error(&config.key, "holds no PEM private key"))?;
    let mut roots = RootCertStore::empty();
    for ca in read_certs(&config.ca)? {
        roots.add(ca).map_err(|e| file_error(&config.ca, e))?;
    }
    let roots = Arc::new(roots);
    let versions = versions(config.min_version);
    let server = |required: bool, alpn: &[u8]| -> Result<Arc<ServerConfig>, TlsError> {
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider());
        let verifier = match required {
            true => verifier.build(),
            false => verifier.allow_unauthenticated().build(),
        }
        .map_err(rustls_error)?;
        let mut server = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .map_err(rustls_error)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(rustls_error)?;
        server.alpn_protocols = vec![alpn.to_vec()];
        Ok(Arc::new(server))
    };
    let client = client_config(
        roots.clone(),
        Some((certs.clone(), key.clone_key())),
        versions,
    )?;
    if let Some(expires) = super::certs::not_after(&certs[0]) {
        metrics::gauge!(m::TLS_CERT_EXPIRES).set(expires as f64);
    }
    Ok(Loaded {
        stamps,
        api: server(false, b"h2")?,
        lease: server(true, b"h2")?,
        metrics: server(false, b"http/1.1")?,
        client,
    })
}

fn client_config(
    roots: Arc<RootCertStore>,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    versions: &[&'static SupportedProtocolVersion],
) -> Result<Arc<ClientConfig>, TlsError> {
    let client = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .map_err(rustls_error)?
        .with_root_certificates(roots);
    let mut client = match identity {
        Some((certs, key)) => client
            .with_client_auth_cert(certs, key)
            .map_err(rustls_error)?,
        None => client.with_no_client_auth(),
    };
    client.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(client))
}

/// A client's TLS (the `geostate` commands, tests): servers' certificates checked against
/// the CA file `ca`, and a client certificate (`identity`: certificate and key files)
/// presented when given.
pub fn client(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(ca)? {
        roots.add(cert).map_err(|e| file_error(ca, e))?;
    }
    let identity = match identity {
        None => None,
        Some((cert, key)) => {
            let key_pem = PrivateKeyDer::from_pem_file(key)
                .map_err(|_| file_error(key, "holds no PEM private key"))?;
            Some((read_certs(cert)?, key_pem))
        }
    };
    client_config(Arc::new(roots), identity, versions(TlsVersion::V1_2))
}

impl Tls {
    /// Reads the section's files; an error names the file.
    pub fn load(config: &TlsConfig) -> Result<Self, TlsError> {
        let loaded = load(config)?;
        Ok(Self(Arc::new(Shared {
            config: config.clone(),
            loaded: RwLock::new(loaded),
        })))
    }

    fn loaded(&self) -> std::sync::RwLockReadGuard<'_, Loaded> {
        self.0.loaded.read().unwrap_or_else(|p| p.into_inner())
    }

    fn server(&self, listener: Listener) -> Arc<ServerConfig> {
        let loaded = self.loaded();
        match listener {
            Listener::Api => loaded.api.clone(),
            Listener::Lease => loaded.lease.clone(),
            Listener::Metrics => loaded.metrics.clone(),
        }
    }

    fn client(&self) -> Arc<ClientConfig> {
        self.loaded().client.clone()
    }

    /// Reads the files again if any changed since they were read (all of them, `forced`);
    /// answers whether the configuration changed. A file that does not load leaves the
    /// current configuration in place.
    pub fn reload(&self, forced: bool) -> Result<bool, TlsError> {
        let config = &self.0.config;
        let stamps = [stamp(&config.cert), stamp(&config.key), stamp(&config.ca)];
        if !forced && stamps == self.loaded().stamps {
            return Ok(false);
        }
        let loaded = load(config)?;
        *self.0.loaded.write().unwrap_or_else(|p| p.into_inner()) = loaded;
        Ok(true)
    }

    /// Reloads on SIGHUP and whenever a file changes, until `stop` turns true.
    pub async fn watch(self, mut stop: watch::Receiver<bool>) {
        let mut hangups =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        loop {
            let forced = tokio::select! {
                _ = crate::shutdown::stopped(&mut stop) => return,
                Some(()) = async {
                    match hangups.as_mut() {
                        Some(h) => h.recv().await,
                        None => std::future::pending().await,
                    }
                } => true,
                () = tokio::time::sleep(RELOAD_CHECK) => false,
            };
            match self.reload(forced) {
                Ok(false) => {}
                Ok(true) => {
                    metrics::counter!(m::TLS_RELOADS, "outcome" => "loaded").increment(1);
                    tracing::info!("TLS certificates reloaded");
                }
                Err(e) => {
                    metrics::counter!(m::TLS_RELOADS, "outcome" => "failed").increment(1);
                    tracing::error!(error = %e, "TLS certificates not reloaded; the current ones stay");
                }
            }
        }
    }
}

/// Who is calling: a request extension on every call a server of this process takes.
#[derive(Clone, Debug, Default)]
pub struct Caller {
    pub remote: Option<SocketAddr>,
    /// The common name of the client certificate the CA vouched for (`None`: plaintext,
    /// or TLS without a client certificate).
    pub name: Option<Arc<str>>,
}

impl Caller {
    /// The caller of `request` (no extension: an in-process call, trusted as plaintext).
    pub fn of<T>(request: &tonic::Request<T>) -> Caller {
        request
            .extensions()
            .get::<Caller>()
            .cloned()
            .unwrap_or_default()
    }
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// An accepted connection: plaintext or TLS, with its [`Caller`].
pub struct Conn {
    stream: Stream,
    caller: Caller,
}

impl Connected for Conn {
    type ConnectInfo = Caller;

    fn connect_info(&self) -> Caller {
        self.caller.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// The connections `listener` accepts, handshaken with `tls` (plaintext: `None`), for
/// tonic's `serve_with_incoming` or the metrics server. A handshake that fails or takes
/// longer than [`HANDSHAKE_TIMEOUT`] is counted and dropped; it never holds up the others.
pub fn incoming(
    listener: TcpListener,
    tls: Option<Tls>,
    kind: Listener,
) -> ReceiverStream<io::Result<Conn>> {
    let (tx, rx) = mpsc::channel(ACCEPTED_QUEUE);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = tx.closed() => return,
            };
            let (tcp, remote) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // out of descriptors, say: wait instead of spinning
                    tracing::warn!(error = %e, listener = kind.name(), "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // as tonic's own listener does: a request's frames written apart (TLS records,
            // a response's trailers) must not wait on the peer's delayed ACK, a round trip
            let _ = tcp.set_nodelay(true);
            let Some(tls) = &tls else {
                let caller = Caller {
                    remote: Some(remote),
                    name: None,
                };
                let conn = Conn {
                    stream: Stream::Plain(tcp),
                    caller,
                };
                if tx.send(Ok(conn)).await.is_err() {
                    return;
                }
                continue;
            };
            let (acceptor, tx) = (TlsAcceptor::from(tls.server(kind)), tx.clone());
            tokio::spawn(async move {
                let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
                let stream = match handshake.await {
                    Ok(Ok(stream)) => stream,
                    failed => {
                        let reason = match failed {
                            Ok(Err(e)) => e.to_string(),
                            _ => "timed out".to_owned(),
                        };
                        metrics::counter!(m::TLS_REFUSED, "listener" => kind.name()).increment(1);
                        tracing::debug!(%remote, reason, listener = kind.name(), "TLS handshake refused");
                        return;
                    }
                };
                let name = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|certs| certs.first())
                    .and_then(super::certs::common_name)
                    .map(Arc::from);
                let conn = Conn {
                    stream: Stream::Tls(Box::new(stream)),
                    caller: Caller {
                        remote: Some(remote),
                        name,
                    },
                };
                let _ = tx.send(Ok(conn)).await;
            });
        }
    });
    ReceiverStream::new(rx)
}

/// The endpoint of `addr` (`host:port`).
fn endpoint(addr: &str, connect_timeout: Duration) -> Result<Endpoint, tonic::transport::Error> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?.connect_timeout(connect_timeout))
}

/// Dials with `tls`'s current client configuration.
fn current(tls: &Tls) -> impl Fn() -> Arc<ClientConfig> + Clone + Send + 'static {
    let tls = tls.clone();
    move || tls.client()
}

/// A channel to `addr` (`host:port`), over TLS when `tls` is set (the server's
/// certificate must name `host`), made at first use and remade after a failure.
pub fn channel(
    addr: &str,
    tls: Option<&Tls>,
    connect_timeout: Duration,
) -> Result<Channel, tonic::transport::Error> {
    let endpoint = endpoint(addr, connect_timeout)?;
    Ok(match tls {
        None => endpoint.connect_lazy(),
        Some(tls) => endpoint.connect_with_connector_lazy(connector(current(tls))),
    })
}

/// Like [`channel`], connected before it returns.
pub async fn connect(
    addr: &str,
    tls: Option<&Tls>,
    connect_timeout: Duration,
) -> Result<Channel, tonic::transport::Error> {
    let endpoint = endpoint(addr, connect_timeout)?;
    match tls {
        None => endpoint.connect().await,
        Some(tls) => {
            endpoint
                .connect_with_connector(connector(current(tls)))
                .await
        }
    }
}

/// Connects to `addr` (`host:port`, or a URL whose scheme is ignored) over TLS with
/// `config` ([`client`]).
pub async fn connect_with(
    addr: &str,
    config: Arc<ClientConfig>,
    connect_timeout: Duration,
) -> Result<Channel, tonic::transport::Error> {
    let addr = addr.split_once("://").map_or(addr, |(_, rest)| rest);
    endpoint(addr, connect_timeout)?
        .connect_with_connector(connector(move || config.clone()))
        .await
}

type Connecting = Pin<
    Box<
        dyn Future<Output = io::Result<TokioIo<tokio_rustls::client::TlsStream<TcpStream>>>> + Send,
    >,
>;

/// Dials TLS with the configuration `current` gives at each connection.
fn connector(
    current: impl Fn() -> Arc<ClientConfig> + Clone + Send + 'static,
) -> impl tower::Service<
    Uri,
    Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>,
    Error = io::Error,
    Future = Connecting,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |uri: Uri| -> Connecting {
        let config = current();
        Box::pin(async move {
            let invalid =
                |what: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{uri}: {what}"));
            let host = uri.host().ok_or_else(|| invalid("no host"))?;
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let port = uri.port_u16().ok_or_else(|| invalid("no port"))?;
            let name =
                ServerName::try_from(host.clone()).map_err(|_| invalid("not a server name"))?;
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            // tonic's own connector does the same (its default)
            tcp.set_nodelay(true)?;
            let stream = TlsConnector::from(config).connect(name, tcp).await?;
            Ok(TokioIo::new(stream))
        })
    })
}
