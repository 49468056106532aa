//! The `[tls]` section (region nodes and the witness: every listener and every client of
//! the process) and `[api.auth]` (who may call what on a region's API). Without `[tls]`
//! every listener must be on loopback unless `allow-plaintext = true` says otherwise, and
//! without `[api.auth]` the API is open (every caller admin) only on a plaintext loopback
//! listener: the local demo. Anything else is an error at start-up that names the field.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::{ConfigError, Secret, invalid};

/// A validated `[tls]` section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsConfig {
    /// This process's certificate chain (PEM), leaf first. Its common name is the
    /// identity it presents: a lease group member's name (its region, or `witness`).
    pub cert: PathBuf,
    /// The certificate's private key (PEM, PKCS#8, SEC1 or PKCS#1).
    pub key: PathBuf,
    /// The certificate authorities (PEM) that sign peers', clients' and servers'
    /// certificates.
    pub ca: PathBuf,
    pub min_version: TlsVersion,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub enum TlsVersion {
    #[serde(rename = "1.2")]
    V1_2,
    #[serde(rename = "1.3")]
    V1_3,
}

/// What an API caller may do; each role may do what the ones before it may.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// `Get`, `BatchGet`, `Scan`, `Watch`, reflection.
    Read,
    /// And `Update`.
    Write,
    /// And every `Admin` call.
    Admin,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Write => "write",
            Role::Admin => "admin",
        }
    }
}

/// A validated `[api.auth]` section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthConfig {
    /// The role of a caller with neither a client certificate nor a bearer token
    /// (`None`: refused `UNAUTHENTICATED`).
    pub anonymous: Option<Role>,
    /// Roles of client certificates by common name. A lease group member's certificate
    /// (another region's node forwarding an owned write, a node of this region routing
    /// a request) has `write` unless named here.
    pub identities: BTreeMap<String, Role>,
    /// Files of bearer tokens (one per line, `#` comments) by role, read at start-up and
    /// again when they change.
    pub token_files: BTreeMap<Role, PathBuf>,
}

impl AuthConfig {
    /// Every caller is admin: the local demo's API on loopback.
    pub fn open() -> Self {
        Self {
            anonymous: Some(Role::Admin),
            identities: BTreeMap::new(),
            token_files: BTreeMap::new(),
        }
    }
}

/// A validated `[kafka.security]` section: how every Kafka client of the node (and
/// the merge's clients of other regions' clusters) authenticates and encrypts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaSecurity {
    /// librdkafka's `security.protocol`: `ssl`, `sasl_ssl` or `sasl_plaintext`.
    pub protocol: String,
    /// SASL: the mechanism (`SCRAM-SHA-512`, `SCRAM-SHA-256`, `PLAIN`), user and
    /// password (read from its file or variable at start-up).
    pub sasl: Option<(String, String, Secret)>,
    /// CA file (PEM) that signs the brokers' certificates (default: the system's).
    pub ca: Option<PathBuf>,
    /// A client certificate and key (PEM) for brokers that ask for one.
    pub identity: Option<(PathBuf, PathBuf)>,
}

impl KafkaSecurity {
    /// The librdkafka properties.
    pub fn properties(&self) -> Vec<(&'static str, String)> {
        let mut properties = vec![("security.protocol", self.protocol.clone())];
        if let Some((mechanism, username, password)) = &self.sasl {
            properties.push(("sasl.mechanisms", mechanism.clone()));
            properties.push(("sasl.username", username.clone()));
            properties.push(("sasl.password", password.expose().to_owned()));
        }
        let path = |p: &PathBuf| p.display().to_string();
        if let Some(ca) = &self.ca {
            properties.push(("ssl.ca.location", path(ca)));
        }
        if let Some((cert, key)) = &self.identity {
            properties.push(("ssl.certificate.location", path(cert)));
            properties.push(("ssl.key.location", path(key)));
        }
        properties
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawKafkaSecurity {
    protocol: String,
    mechanism: Option<String>,
    username: Option<String>,
    password_file: Option<PathBuf>,
    password_env: Option<String>,
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

const PROTOCOLS: [&str; 3] = ["ssl", "sasl_ssl", "sasl_plaintext"];
const MECHANISMS: [&str; 3] = ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"];

impl RawKafkaSecurity {
    pub(crate) fn validate(self) -> Result<KafkaSecurity, ConfigError> {
        let field = "kafka.security";
        let protocol = self.protocol.to_ascii_lowercase();
        if !PROTOCOLS.contains(&protocol.as_str()) {
            return Err(invalid(
                "kafka.security.protocol",
                format!("{:?} is not one of {}", self.protocol, PROTOCOLS.join(", ")),
            ));
        }
        let sasl = if protocol.starts_with("sasl") {
            let mechanism = self.mechanism.unwrap_or_else(|| "SCRAM-SHA-512".into());
            if !MECHANISMS.contains(&mechanism.as_str()) {
                return Err(invalid(
                    "kafka.security.mechanism",
                    format!("{mechanism:?} is not one of {}", MECHANISMS.join(", ")),
                ));
            }
            let username = self
                .username
                .ok_or_else(|| invalid("kafka.security.username", "SASL needs a username"))?;
            let password = match (self.password_file, self.password_env) {
                (Some(file), None) => std::fs::read_to_string(&file)
                    .map(|text| text.trim_end_matches(['\r', '\n']).to_owned())
                    .map_err(|e| {
                        let reason = format!("cannot read {}: {e}", file.display());
                        invalid("kafka.security.password-file", reason)
                    })?,
                (None, Some(var)) => std::env::var(&var).map_err(|_| {
                    invalid("kafka.security.password-env", format!("${var} is not set"))
                })?,
                _ => {
                    return Err(invalid(
                        field,
                        "SASL needs one of password-file and password-env",
                    ));
                }
            };
            Some((mechanism, username, Secret::new(password)))
        } else {
            None
        };
        let identity = match (self.cert, self.key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err(invalid(field, "cert and key go together")),
        };
        Ok(KafkaSecurity {
            protocol,
            sasl,
            ca: self.ca,
            identity,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawTls {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
    #[serde(default = "default_min_version")]
    min_version: TlsVersion,
}

fn default_min_version() -> TlsVersion {
    TlsVersion::V1_3
}

impl RawTls {
    pub(crate) fn validate(self) -> TlsConfig {
        TlsConfig {
            cert: self.cert,
            key: self.key,
            ca: self.ca,
            min_version: self.min_version,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawAuth {
    #[serde(default = "default_anonymous")]
    anonymous: String,
    #[serde(default)]
    identities: BTreeMap<String, Role>,
    #[serde(default)]
    token_files: BTreeMap<Role, PathBuf>,
}

fn default_anonymous() -> String {
    "none".into()
}

impl RawAuth {
    fn validate(self) -> Result<AuthConfig, ConfigError> {
        let anonymous = match self.anonymous.as_str() {
            "none" => None,
            "read" => Some(Role::Read),
            "write" => Some(Role::Write),
            "admin" => Some(Role::Admin),
            other => {
                return Err(invalid(
                    "api.auth.anonymous",
                    format!("{other:?} is not one of none, read, write, admin"),
                ));
            }
        };
        Ok(AuthConfig {
            anonymous,
            identities: self.identities,
            token_files: self.token_files,
        })
    }
}

/// The API's authorization: the section as given, or (absent) an open API, which only a
/// plaintext loopback listener may have.
pub(crate) fn api_auth(
    raw: Option<RawAuth>,
    tls: Option<&TlsConfig>,
    grpc_listen: SocketAddr,
) -> Result<AuthConfig, ConfigError> {
    match raw {
        Some(raw) => raw.validate(),
        None if tls.is_none() && grpc_listen.ip().is_loopback() => Ok(AuthConfig::open()),
        None => Err(invalid(
            "api.auth",
            format!(
                "the API on {grpc_listen}{} needs an [api.auth] section \
                 (anonymous = \"admin\" for an API open to every caller)",
                if tls.is_some() { " with TLS" } else { "" }
            ),
        )),
    }
}

/// Without TLS, a listener off loopback is refused unless `allow-plaintext` says so.
pub(crate) fn check_plaintext(
    tls: Option<&TlsConfig>,
    allow_plaintext: bool,
    listeners: &[(&'static str, SocketAddr)],
) -> Result<(), ConfigError> {
    if tls.is_some() || allow_plaintext {
        return Ok(());
    }
    match listeners.iter().find(|(_, addr)| !addr.ip().is_loopback()) {
        Some((field, addr)) => Err(invalid(
            field,
            format!(
                "{addr} is not a loopback address and there is no [tls] section \
                 (allow-plaintext = true serves it in plaintext anyway)"
            ),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    fn tls() -> TlsConfig {
        RawTls {
            cert: "a.pem".into(),
            key: "a.key".into(),
            ca: "ca.pem".into(),
            min_version: TlsVersion::V1_3,
        }
        .validate()
    }

    #[test]
    fn an_api_without_auth_is_open_only_in_plaintext_on_loopback() {
        let open = api_auth(None, None, addr("127.0.0.1:50051")).unwrap();
        assert_eq!(open.anonymous, Some(Role::Admin));
        let error = api_auth(None, None, addr("0.0.0.0:50051")).unwrap_err();
        assert!(error.to_string().contains("api.auth"), "{error}");
        assert!(api_auth(None, Some(&tls()), addr("127.0.0.1:50051")).is_err());
    }

    #[test]
    fn auth_names_roles_and_refuses_unknown_ones() {
        let raw: RawAuth = toml::from_str(
            r#"
            anonymous = "read"
            identities = { pricing = "write", ops = "admin" }
            token-files = { admin = "admin.tokens" }
            "#,
        )
        .unwrap();
        let auth = raw.validate().unwrap();
        assert_eq!(auth.anonymous, Some(Role::Read));
        assert_eq!(auth.identities["ops"], Role::Admin);
        assert_eq!(
            auth.token_files[&Role::Admin],
            PathBuf::from("admin.tokens")
        );
        let raw: RawAuth = toml::from_str(r#"anonymous = "root""#).unwrap();
        assert!(raw.validate().is_err());
        assert!(toml::from_str::<RawAuth>(r#"identities = { x = "root" }"#).is_err());
        assert!(Role::Read < Role::Write && Role::Write < Role::Admin);
    }

    #[test]
    fn plaintext_off_loopback_needs_tls_or_an_explicit_allowance() {
        let listeners = [
            ("api.grpc-listen", addr("127.0.0.1:50051")),
            ("lease.listen", addr("10.0.0.5:7301")),
        ];
        let error = check_plaintext(None, false, &listeners).unwrap_err();
        assert!(error.to_string().contains("lease.listen"), "{error}");
        assert!(check_plaintext(None, true, &listeners).is_ok());
        assert!(check_plaintext(Some(&tls()), false, &listeners).is_ok());
        assert!(check_plaintext(None, false, &listeners[..1]).is_ok());
    }

    #[test]
    fn kafka_sasl_reads_its_password_and_never_shows_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kafka.password");
        std::fs::write(&file, "s3cr3t-pass\n").unwrap();
        let raw: RawKafkaSecurity = toml::from_str(&format!(
            r#"
            protocol = "SASL_SSL"
            username = "geostate"
            password-file = {:?}
            ca = "ca.pem"
            "#,
            file.display().to_string()
        ))
        .unwrap();
        let security = raw.validate().unwrap();
        let properties = security.properties();
        assert!(properties.contains(&("security.protocol", "sasl_ssl".into())));
        assert!(properties.contains(&("sasl.mechanisms", "SCRAM-SHA-512".into())));
        assert!(properties.contains(&("sasl.password", "s3cr3t-pass".into())));
        assert!(properties.contains(&("ssl.ca.location", "ca.pem".into())));
        let shown = format!("{security:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        // no password, an unknown protocol or mechanism: errors naming the field
        let err = |text: &str| {
            let raw: RawKafkaSecurity = toml::from_str(text).unwrap();
            raw.validate().unwrap_err().to_string()
        };
        assert!(
            err(r#"protocol = "sasl_ssl"
username = "u""#)
            .contains("password")
        );
        assert!(err(r#"protocol = "kerberos""#).contains("kafka.security.protocol"));
        assert!(
            err(r#"protocol = "sasl_ssl"
mechanism = "GSSAPI"
username = "u"
password-env = "X""#)
            .contains("mechanism")
        );
        let missing = err(r#"protocol = "sasl_ssl"
username = "u"
password-file = "/nonexistent/pw""#);
        assert!(missing.contains("/nonexistent/pw"), "{missing}");
    }

    #[test]
    fn tls_defaults_to_version_1_3_and_takes_1_2() {
        let raw: RawTls = toml::from_str(
            r#"cert = "a"
key = "b"
ca = "c""#,
        )
        .unwrap();
        assert_eq!(raw.validate().min_version, TlsVersion::V1_3);
        let raw: RawTls = toml::from_str(
            r#"cert = "a"
key = "b"
ca = "c"
min-version = "1.2""#,
        )
        .unwrap();
        assert_eq!(raw.validate().min_version, TlsVersion::V1_2);
    }
}
