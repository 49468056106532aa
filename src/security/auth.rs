//! Who may call what: a tower layer in front of a tonic server that answers a call it
//! refuses with a gRPC status before any handler runs. Two policies use it: the region
//! API's roles ([`ApiPolicy`]: a certificate's common name or a bearer token, else the
//! anonymous role) and the lease group's members ([`MemberPolicy`]: only a certificate
//! naming a configured member, or an operator asking for a change of the group).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use tonic::Status;
use tonic_types::{ErrorDetails, StatusExt};

use super::limits::Limits;
use super::tls::Caller;
use crate::config::{AuthConfig, CallLimit, Role};
use crate::metrics as m;

/// What an admitted call holds while it runs (a place among its caller's calls in
/// flight, where its role bounds them).
pub type Admission = Option<tokio::sync::OwnedSemaphorePermit>;

/// Decides whether a call may proceed.
pub trait Policy: Send + Sync + 'static {
    /// `path`: the call's `/package.Service/Method`.
    fn admit(&self, caller: &Caller, path: &str, token: Option<&str>) -> Result<Admission, Status>;
}

/// The layer: `Server::builder().layer(Guard::new(policy))`.
#[derive(Clone)]
pub struct Guard(Option<Arc<dyn Policy>>);

impl Guard {
    pub fn new(policy: impl Policy) -> Self {
        Self(Some(Arc::new(policy)))
    }

    /// Admits every call.
    pub fn none() -> Self {
        Self(None)
    }
}

impl<S> tower::Layer<S> for Guard {
    type Service = Guarded<S>;

    fn layer(&self, inner: S) -> Guarded<S> {
        Guarded {
            inner,
            policy: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Guarded<S> {
    inner: S,
    policy: Option<Arc<dyn Policy>>,
}

type Answer<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for Guarded<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Answer<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let Some(policy) = &self.policy else {
            return Box::pin(self.inner.call(request));
        };
        let caller = request
            .extensions()
            .get::<Caller>()
            .cloned()
            .unwrap_or_default();
        let token = request
            .headers()
            .get(http::header::AUTHORIZATION)
            .map(|v| v.to_str().map(|v| v.strip_prefix("Bearer ").unwrap_or("")));
        let admitted = match token {
            Some(Err(_)) => Err(Status::unauthenticated(
                "the authorization header is not text",
            )),
            Some(Ok(token)) => policy.admit(&caller, request.uri().path(), Some(token)),
            None => policy.admit(&caller, request.uri().path(), None),
        };
        match admitted {
            Ok(None) => Box::pin(self.inner.call(request)),
            Ok(Some(place)) => {
                // held until the answer starts (a stream's messages are not counted)
                let answer = self.inner.call(request);
                Box::pin(async move {
                    let answer = answer.await;
                    drop(place);
                    answer
                })
            }
            Err(status) => {
                metrics::counter!(m::CALLS_REFUSED, "code" => format!("{:?}", status.code()))
                    .increment(1);
                tracing::debug!(path = request.uri().path(), caller = ?caller.name, reason = status.message(), "call refused");
                // only a caller over its limits is refused RESOURCE_EXHAUSTED here: its
                // refusal waits, so that refusing costs a flooding caller as much time as
                // it costs the node
                let wait = match status.code() {
                    tonic::Code::ResourceExhausted => LIMITED_ANSWER_AFTER,
                    _ => Duration::ZERO,
                };
                Box::pin(async move {
                    tokio::time::sleep(wait).await;
                    Ok(status.into_http())
                })
            }
        }
    }
}

/// How long a call refused for its caller's limits waits for its answer: a caller that
/// keeps n calls in flight is refused at most 10·n times a second.
const LIMITED_ANSWER_AFTER: Duration = Duration::from_millis(100);

/// The role `path` needs (`None`: anyone, the health service).
fn needed(path: &str) -> Option<Role> {
    let (service, method) = path.trim_start_matches('/').split_once('/')?;
    match service {
        "grpc.health.v1.Health" => None,
        "geostate.v1.Admin" => Some(Role::Admin),
        "geostate.v1.State" if method == "Update" => Some(Role::Write),
        _ => Some(Role::Read),
    }
}

/// The token files' modification times when read, and the tokens with their roles.
type Read = (Vec<Option<SystemTime>>, Vec<(String, Role)>);

/// Bearer tokens by role, as read from their files last.
struct Tokens {
    files: BTreeMap<Role, PathBuf>,
    read: RwLock<Read>,
    /// When the files' times were last looked at: at most every `recheck`, so a call
    /// does no file system call of its own.
    checked: std::sync::Mutex<Instant>,
    recheck: Duration,
}

/// How often the token files' times are looked at (a call that comes later looks).
const TOKENS_RECHECK: Duration = Duration::from_secs(1);

impl Tokens {
    /// Reads the files now.
    fn new(files: &BTreeMap<Role, PathBuf>) -> Result<Self, String> {
        Ok(Self {
            files: files.clone(),
            read: RwLock::new((stamps(files), Self::load(files)?)),
            checked: std::sync::Mutex::new(Instant::now()),
            recheck: TOKENS_RECHECK,
        })
    }

    fn load(files: &BTreeMap<Role, PathBuf>) -> Result<Vec<(String, Role)>, String> {
        let mut tokens = Vec::new();
        for (role, path) in files {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("token file {}: {e}", path.display()))?;
            let lines = text.lines().map(str::trim);
            let found = lines.filter(|l| !l.is_empty() && !l.starts_with('#'));
            tokens.extend(found.map(|t| (t.to_owned(), *role)));
        }
        Ok(tokens)
    }

    /// Whether the files' times are to be looked at now (at most every `recheck`).
    fn due(&self) -> bool {
        let mut checked = self.checked.lock().unwrap_or_else(|p| p.into_inner());
        let due = checked.elapsed() >= self.recheck;
        if due {
            *checked = Instant::now();
        }
        due
    }

    /// The role of `token`; the files are read again first when they changed (a file
    /// that cannot be read keeps the tokens read before).
    fn role_of(&self, token: &str) -> Option<Role> {
        if self.due() {
            let stamps = stamps(&self.files);
            if self.read.read().unwrap_or_else(|p| p.into_inner()).0 != stamps {
                match Self::load(&self.files) {
                    Ok(tokens) => {
                        *self.read.write().unwrap_or_else(|p| p.into_inner()) = (stamps, tokens)
                    }
                    Err(e) => tracing::error!(error = e, "bearer tokens not reloaded"),
                }
            }
        }
        let read = self.read.read().unwrap_or_else(|p| p.into_inner());
        // every token compared in full: the time taken tells nothing about the match
        read.1
            .iter()
            .filter(|(t, _)| same(t.as_bytes(), token.as_bytes()))
            .map(|(_, role)| *role)
            .max()
    }
}

/// The files' modification times (`None`: unreadable).
fn stamps(files: &BTreeMap<Role, PathBuf>) -> Vec<Option<SystemTime>> {
    let stamp = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    files.values().map(stamp).collect()
}

/// FNV-1a: a token's name in the metrics and logs, never the token.
fn fnv1a(bytes: &[u8]) -> u64 {
    (bytes.iter()).fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Constant-time equality of two byte strings of the same length.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The region API's roles.
pub struct ApiPolicy {
    auth: AuthConfig,
    tokens: Tokens,
    /// Lease group members' names: other regions' nodes forward owned writes, this
    /// region's nodes route requests; they write unless `identities` says otherwise.
    members: BTreeSet<String>,
    limits: Limits,
}

impl ApiPolicy {
    /// Reads the token files now: a file that cannot be read is an error at start-up.
    pub fn new(
        auth: AuthConfig,
        members: BTreeSet<String>,
        limits: BTreeMap<Role, CallLimit>,
    ) -> Result<Self, String> {
        let tokens = Tokens::new(&auth.token_files)?;
        Ok(Self {
            auth,
            tokens,
            members,
            limits: Limits::new(limits),
        })
    }

    /// Takes a call of `caller` (of `role`) within its limits; a lease group member's is
    /// not limited (it carries many clients' calls).
    fn limit(&self, caller: &Caller, token: Option<&str>, role: Role) -> Result<Admission, Status> {
        let name = caller.name.as_deref();
        if !self.limits.bounds(role) || name.is_some_and(|n| self.members.contains(n)) {
            return Ok(None);
        }
        // the caller as limited, and as counted (a bounded set of names: certificates are
        // issued, tokens and addresses are not, and a token is never shown)
        let (who, counted) = match (name, token, caller.remote) {
            (Some(name), _, _) => (format!("cert:{name}"), format!("cert:{name}")),
            (None, Some(token), _) => (
                format!("token:{:016x}", fnv1a(token.as_bytes())),
                "token".into(),
            ),
            (None, None, Some(remote)) => (format!("ip:{}", remote.ip()), "ip".into()),
            (None, None, None) => ("in-process".to_owned(), "in-process".into()),
        };
        self.limits.take(&who, role, Instant::now()).map_err(|e| {
            metrics::counter!(m::CALLS_LIMITED, "caller" => counted, "limit" => e.limit)
                .increment(1);
            let shown = if token.is_some() && name.is_none() {
                "this token"
            } else {
                &who
            };
            let why = format!(
                "{shown} is over its {} limit ({} role, api.limits): retry after {} ms",
                e.limit,
                role.name(),
                e.retry_after.as_millis()
            );
            let retry = ErrorDetails::with_retry_info(Some(e.retry_after));
            Status::with_error_details(tonic::Code::ResourceExhausted, why, retry)
        })
    }

    /// The caller's role: the best of its certificate's and its token's; the anonymous
    /// role only for a caller with neither. A token that is not known is refused.
    fn role(&self, caller: &Caller, token: Option<&str>) -> Result<Option<Role>, Status> {
        let by_cert = caller.name.as_deref().and_then(|name| {
            let member = self.members.contains(name).then_some(Role::Write);
            self.auth.identities.get(name).copied().or(member)
        });
        let by_token = match token {
            None => None,
            Some(token) => match self.tokens.role_of(token) {
                Some(role) => Some(role),
                None => return Err(Status::unauthenticated("the bearer token is not valid")),
            },
        };
        if caller.name.is_none() && token.is_none() {
            return Ok(self.auth.anonymous);
        }
        Ok(by_cert.max(by_token))
    }
}

impl Policy for ApiPolicy {
    fn admit(&self, caller: &Caller, path: &str, token: Option<&str>) -> Result<Admission, Status> {
        let Some(needed) = needed(path) else {
            return Ok(None);
        };
        let role = self.role(caller, token)?;
        if let Some(role) = role
            && role >= needed
        {
            return self.limit(caller, token, role);
        }
        let method = path.trim_start_matches('/');
        match (&caller.name, token, role) {
            (None, None, None) => Err(Status::unauthenticated(format!(
                "{method} needs the {} role: present a client certificate or a bearer token",
                needed.name()
            ))),
            (name, _, role) => Err(Status::permission_denied(format!(
                "{method} needs the {} role; the caller{} has {}",
                needed.name(),
                name.as_ref().map(|n| format!(" {n}")).unwrap_or_default(),
                role.map_or("no role", Role::name)
            ))),
        }
    }
}

/// The lease group's: a caller's certificate must name a configured member, or an
/// operator asking for a change of the group's members (which the service admits for
/// removing a region only).
pub struct MemberPolicy {
    pub members: BTreeSet<String>,
    /// `lease.operators`.
    pub operators: BTreeSet<String>,
}

/// The lease group's call for changes of its members.
const GROUP_CHANGE: &str = "/geostate.v1.LeaseRaft/Learner";

impl Policy for MemberPolicy {
    fn admit(
        &self,
        caller: &Caller,
        path: &str,
        _token: Option<&str>,
    ) -> Result<Admission, Status> {
        match caller.name.as_deref() {
            Some(name) if self.members.contains(name) => Ok(None),
            Some(name) if self.operators.contains(name) && path == GROUP_CHANGE => Ok(None),
            Some(name) => Err(Status::permission_denied(format!(
                "{name} is not a member of the lease group"
            ))),
            None => Err(Status::unauthenticated(
                "the lease group takes calls from its members' certificates only",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn caller(name: Option<&str>) -> Caller {
        Caller {
            remote: None,
            name: name.map(Arc::from),
        }
    }

    fn policy(anonymous: Option<Role>, tokens: &str) -> (ApiPolicy, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("read.tokens");
        std::fs::write(&file, tokens).unwrap();
        let auth = AuthConfig {
            anonymous,
            identities: BTreeMap::from([("ops".to_owned(), Role::Admin)]),
            token_files: BTreeMap::from([(Role::Read, file)]),
        };
        let members = BTreeSet::from(["us-east-1".to_owned()]);
        (ApiPolicy::new(auth, members, BTreeMap::new()).unwrap(), dir)
    }

    const UPDATE: &str = "/geostate.v1.State/Update";
    const GET: &str = "/geostate.v1.State/Get";
    const TRANSFER: &str = "/geostate.v1.Admin/TransferLease";

    #[test]
    fn roles_come_from_certificates_tokens_or_the_anonymous_setting() {
        let (p, _dir) = policy(None, "# readers\nr-token\n");
        let code =
            |c: &Caller, path, token| p.admit(c, path, token).map(drop).map_err(|s| s.code());
        // nobody: unauthenticated, except for health
        assert_eq!(code(&caller(None), GET, None), Err(Code::Unauthenticated));
        assert_eq!(
            code(&caller(None), "/grpc.health.v1.Health/Check", None),
            Ok(())
        );
        // a read token reads, and neither writes nor administers
        assert_eq!(code(&caller(None), GET, Some("r-token")), Ok(()));
        assert_eq!(
            code(&caller(None), UPDATE, Some("r-token")),
            Err(Code::PermissionDenied)
        );
        assert_eq!(
            code(&caller(None), TRANSFER, Some("r-token")),
            Err(Code::PermissionDenied)
        );
        assert_eq!(
            code(&caller(None), GET, Some("r-token2")),
            Err(Code::Unauthenticated)
        );
        assert_eq!(
            code(&caller(None), GET, Some("")),
            Err(Code::Unauthenticated)
        );
        // a member writes (forwarded writes) but does not administer; ops does
        assert_eq!(code(&caller(Some("us-east-1")), UPDATE, None), Ok(()));
        assert_eq!(
            code(&caller(Some("us-east-1")), TRANSFER, None),
            Err(Code::PermissionDenied)
        );
        assert_eq!(code(&caller(Some("ops")), TRANSFER, None), Ok(()));
        // an unknown certificate has no role
        assert_eq!(
            code(&caller(Some("stranger")), GET, None),
            Err(Code::PermissionDenied)
        );
    }

    #[test]
    fn the_anonymous_role_is_only_for_callers_with_no_credentials() {
        let (p, _dir) = policy(Some(Role::Read), "r-token\n");
        assert!(p.admit(&caller(None), GET, None).is_ok());
        assert!(p.admit(&caller(None), UPDATE, None).is_err());
        assert!(p.admit(&caller(None), GET, Some("wrong")).is_err());
    }

    #[test]
    fn a_changed_token_file_is_read_again() {
        let (mut p, dir) = policy(None, "old\n");
        p.tokens.recheck = Duration::ZERO;
        assert!(p.admit(&caller(None), GET, Some("old")).is_ok());
        let file = dir.path().join("read.tokens");
        // a later modification time, whatever the file system's resolution
        std::fs::write(&file, "new\n").unwrap();
        let later = SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(later)
            .unwrap();
        assert!(p.admit(&caller(None), GET, Some("new")).is_ok());
        assert!(p.admit(&caller(None), GET, Some("old")).is_err());
    }

    /// Members, and operators for changes of the group only.
    #[test]
    fn the_lease_group_takes_members_only() {
        let p = MemberPolicy {
            members: BTreeSet::from(["witness".to_owned()]),
            operators: BTreeSet::from(["ops".to_owned()]),
        };
        assert!(p.admit(&caller(Some("witness")), "/x/y", None).is_ok());
        assert!(p.admit(&caller(Some("ops")), GROUP_CHANGE, None).is_ok());
        let code = |c: &Caller| p.admit(c, "/x/y", None).unwrap_err().code();
        assert_eq!(code(&caller(Some("eve"))), Code::PermissionDenied);
        assert_eq!(code(&caller(Some("ops"))), Code::PermissionDenied);
        assert_eq!(code(&caller(None)), Code::Unauthenticated);
    }

    #[test]
    fn equal_means_equal_bytes() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
    }
}
