//! Certificates: the identity and expiry of a certificate, and `geostate certs`, which
//! makes a development CA and a certificate per name signed by it (each usable as a
//! server and as a client: a node serves its API and calls other regions').

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::CertificateDer;

/// The subject common name of `cert` (`None`: none, or not a certificate).
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let name = parsed.subject().iter_common_name().next()?;
    name.as_str().ok().map(str::to_owned)
}

/// When `cert` stops being valid, Unix seconds.
pub fn not_after(cert: &CertificateDer<'_>) -> Option<i64> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    Some(parsed.validity().not_after.timestamp())
}

#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("making a certificate: {0}")]
    Rcgen(#[from] rcgen::Error),
}

/// A CA: its certificate (PEM) and the parameters and key that sign with it.
pub struct Authority {
    pub pem: String,
    params: CertificateParams,
    key: KeyPair,
}

impl Authority {
    /// A new self-signed CA named `name`, valid for `valid_for` from now.
    pub fn new(name: &str, valid_for: Duration) -> Result<Self, CertsError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = distinguished(name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        validity(&mut params, -60, valid_for);
        let key = KeyPair::generate()?;
        let pem = params.self_signed(&key)?.pem();
        Ok(Self { pem, params, key })
    }

    /// A certificate for `name` (its common name, and a DNS name with `localhost` and
    /// `127.0.0.1` for servers), valid from `from_secs` (relative to now; negative: in the
    /// past) for `valid_for`: its PEM and its key's (PKCS#8) PEM.
    pub fn issue(
        &self,
        name: &str,
        hosts: &[String],
        from_secs: i64,
        valid_for: Duration,
    ) -> Result<(String, String), CertsError> {
        let mut sans = vec![name.to_owned(), "localhost".into(), "127.0.0.1".into()];
        sans.extend(hosts.iter().cloned());
        sans.dedup();
        let mut params = CertificateParams::new(sans)?;
        params.distinguished_name = distinguished(name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        validity(&mut params, from_secs, valid_for);
        let key = KeyPair::generate()?;
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

fn distinguished(name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    dn.push(DnType::OrganizationName, "geostate development");
    dn
}

fn validity(params: &mut CertificateParams, from_secs: i64, valid_for: Duration) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now + time::Duration::seconds(from_secs);
    params.not_after = params.not_before + time::Duration::seconds(valid_for.as_secs() as i64);
}

fn write(path: &Path, text: &str, private: bool) -> Result<(), CertsError> {
    let io = |source| CertsError::Io {
        path: path.to_owned(),
        source,
    };
    std::fs::write(path, text).map_err(io)?;
    if private {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    }
    Ok(())
}

/// `geostate certs`: in `dir`, `ca.pem` (and `ca.key`) and `<name>.pem`, `<name>.key` per
/// name, each valid for `valid_for`. Answers the files written.
pub fn make(
    dir: &Path,
    names: &[String],
    hosts: &[String],
    valid_for: Duration,
) -> Result<Vec<PathBuf>, CertsError> {
    std::fs::create_dir_all(dir).map_err(|source| CertsError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let ca = Authority::new("geostate development CA", valid_for)?;
    let mut written = vec![dir.join("ca.pem"), dir.join("ca.key")];
    write(&written[0], &ca.pem, false)?;
    write(&written[1], &ca.key.serialize_pem(), true)?;
    for name in names {
        let (cert, key) = ca.issue(name, hosts, -60, valid_for)?;
        let (cert_path, key_path) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        write(&cert_path, &cert, false)?;
        write(&key_path, &key, true)?;
        written.extend([cert_path, key_path]);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;

    #[test]
    fn an_issued_certificate_carries_its_name_and_expiry() {
        let ca = Authority::new("test CA", Duration::from_secs(3600)).unwrap();
        let (pem, _) = ca
            .issue("eu-west-1", &[], -60, Duration::from_secs(600))
            .unwrap();
        let der = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        assert_eq!(common_name(&der).as_deref(), Some("eu-west-1"));
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let expires = not_after(&der).unwrap();
        assert!(
            (now + 500..=now + 600).contains(&expires),
            "{expires} vs {now}"
        );
    }
}
