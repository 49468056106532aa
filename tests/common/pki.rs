//! Certificates for tests: a CA in a folder, and certificates it (or another CA) signs,
//! valid now, expired, or for any name.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use geostate::config::{TlsConfig, TlsVersion};
use geostate::security::certs::Authority;

const DAY: Duration = Duration::from_secs(86_400);

/// A CA and the folder its files go to.
pub struct Pki {
    pub dir: PathBuf,
    pub ca: PathBuf,
    authority: Authority,
}

impl Pki {
    /// A new CA whose certificate is `<dir>/<label>-ca.pem`.
    pub fn new(dir: &Path, label: &str) -> anyhow::Result<Self> {
        let authority = Authority::new(&format!("{label} CA"), DAY)?;
        let ca = dir.join(format!("{label}-ca.pem"));
        std::fs::write(&ca, &authority.pem)?;
        Ok(Self {
            dir: dir.to_owned(),
            ca,
            authority,
        })
    }

    /// A certificate for `name` valid for a day: its certificate and key files.
    pub fn issue(&self, name: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
        self.issue_at(name, name, -60, DAY)
    }

    /// A certificate for `name` that expired an hour ago, in files labelled `label`.
    pub fn expired(&self, name: &str, label: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
        self.issue_at(name, label, -2 * 86_400, DAY - Duration::from_secs(3600))
    }

    fn issue_at(
        &self,
        name: &str,
        label: &str,
        from_secs: i64,
        valid_for: Duration,
    ) -> anyhow::Result<(PathBuf, PathBuf)> {
        let (cert, key) = self.authority.issue(name, &[], from_secs, valid_for)?;
        let paths = (
            self.dir.join(format!("{label}.pem")),
            self.dir.join(format!("{label}.key")),
        );
        std::fs::write(&paths.0, cert)?;
        std::fs::write(&paths.1, key)?;
        Ok(paths)
    }

    /// A `[tls]` section for a process with the certificate `name` (issued first).
    pub fn tls(&self, name: &str) -> anyhow::Result<TlsConfig> {
        let (cert, key) = self.issue(name)?;
        Ok(TlsConfig {
            cert,
            key,
            ca: self.ca.clone(),
            min_version: TlsVersion::V1_3,
        })
    }

    /// A client's TLS trusting this CA, presenting `identity` when given.
    pub fn client(
        &self,
        identity: Option<&(PathBuf, PathBuf)>,
    ) -> anyhow::Result<Arc<rustls::ClientConfig>> {
        let identity = identity.map(|(c, k)| (c.as_path(), k.as_path()));
        Ok(geostate::security::tls::client(&self.ca, identity)?)
    }
}
