//! The cluster's credentials: its certificate authority (`ftvm cluster
//! init`), the directory each host and each operator holds (`ftvm cluster
//! issue`), and the TLS made of them.
//!
//! A credentials directory holds `token` (the API's bearer token), `ca.pem`
//! (the authority's certificate, the only one trusted), and `cert.pem` and
//! `key.pem` (this host's or operator's certificate, signed by the
//! authority, for TLS servers and clients alike). Everything the cluster
//! says on the network goes over TLS under that authority: the agents'
//! API and dashboard (HTTPS; a client proves itself with the token), and
//! etcd (which asks every client and peer for a certificate of the
//! authority's: it holds the pairs' keys). The authority's own key stays
//! in the directory `init` made, which no host needs.
//!
//! The certificates are made with rcgen (ECDSA P-256), rather than by
//! asking an operator to run openssl: a cluster is one command away.

use crate::authority::files::{create, private, FileError};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::net::IpAddr;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The files of a credentials directory, and of the authority's.
pub const TOKEN: &str = "token";
pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca.key";
pub const CERT: &str = "cert.pem";
pub const KEY: &str = "key.pem";

/// How long the authority's certificate is valid.
const CA_YEARS: i64 = 10;
/// How long a host's or operator's certificate is valid (issued again,
/// with the same authority, before then).
const CERT_YEARS: i64 = 2;

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("{} {why}", .path.display())]
    Invalid { path: PathBuf, why: String },
    #[error("cannot make a certificate: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("the TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("{0}")]
    Token(String),
    #[error("{0:?} is not a name for a certificate (letters, digits, '-', '_', '.')")]
    Name(String),
    #[error("{0}")]
    Etcd(#[from] ftvm_etcd::EtcdError),
    #[error("{0}")]
    File(#[from] FileError),
}

/// A credentials directory's contents.
#[derive(Clone)]
pub struct Credentials {
    /// Where they were read from (handed to the VMs' processes, which
    /// speak to etcd with them).
    pub dir: PathBuf,
    /// The API's bearer token.
    pub token: String,
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
    /// The authority's certificate: the one root a client trusts.
    ca: CertificateDer<'static>,
    /// The same, as the agents' client takes them.
    agent_tls: ureq::tls::TlsConfig,
    /// The same, as etcd's client takes them.
    etcd_tls: ftvm_etcd::EtcdTls,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token or the key.
        write!(f, "Credentials({})", self.dir.display())
    }
}

fn read(path: &Path) -> Result<Vec<u8>, CredentialsError> {
    std::fs::read(path).map_err(|source| FileError::Read { path: path.into(), source }.into())
}

fn invalid(path: &Path, why: impl Into<String>) -> CredentialsError {
    CredentialsError::Invalid { path: path.into(), why: why.into() }
}

impl Credentials {
    /// The credentials in `dir`.
    pub fn read(dir: &Path) -> Result<Credentials, CredentialsError> {
        let dir = std::path::absolute(dir).map_err(|source| FileError::Read { path: dir.into(), source })?;
        let token = crate::authority::token::read(&dir.join(TOKEN)).map_err(CredentialsError::Token)?;
        let ca_path = dir.join(CA_CERT);
        let ca_pem = read(&ca_path)?;
        let ca = CertificateDer::from_pem_slice(&ca_pem)
            .map_err(|e| invalid(&ca_path, format!("holds no PEM certificate: {e}")))?;
        let cert_path = dir.join(CERT);
        let cert_pem = read(&cert_path)?;
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(&cert_path, format!("holds no PEM certificate: {e}")))?;
        if chain.is_empty() {
            return Err(invalid(&cert_path, "holds no PEM certificate"));
        }
        let key_path = dir.join(KEY);
        private(&key_path)?;
        let key_pem = read(&key_path)?;
        let no_key = |e: &dyn std::fmt::Display| invalid(&key_path, format!("holds no PEM private key: {e}"));
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| no_key(&e))?;
        // Only the cluster's authority is trusted (not the web's), and
        // this side's certificate is shown.
        let agent_tls = ureq::tls::TlsConfig::builder()
            .provider(ureq::tls::TlsProvider::Rustls)
            .root_certs(ureq::tls::RootCerts::new_with_certs(&[ureq::tls::Certificate::from_der(&ca).to_owned()]))
            .client_cert(Some(ureq::tls::ClientCert::new_with_certs(
                &chain.iter().map(|c| ureq::tls::Certificate::from_der(c).to_owned()).collect::<Vec<_>>(),
                ureq::tls::PrivateKey::from_pem(&key_pem).map_err(|e| no_key(&e))?,
            )))
            .build();
        let etcd_tls = ftvm_etcd::EtcdTls::new(ca_pem, cert_pem, key_pem);
        Ok(Credentials { dir, token, chain, key: Arc::new(key), ca: ca.into_owned(), agent_tls, etcd_tls })
    }

    /// The same credentials with another token (a client that holds the
    /// cluster's authority but not its token: the tests' stranger).
    #[must_use]
    pub fn with_token(&self, token: &str) -> Credentials {
        Credentials { token: token.into(), ..self.clone() }
    }

    /// How etcd is spoken to at `urls` (comma-separated `https://HOST:PORT`).
    pub fn etcd(&self, urls: &str) -> Result<ftvm_etcd::Endpoints, CredentialsError> {
        Ok(ftvm_etcd::Endpoints::parse(urls, Some(self.etcd_tls.clone()))?)
    }

    /// The agent's HTTPS server: this host's certificate; clients are not
    /// asked for one (a browser has none), they show the token.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, CredentialsError> {
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()?
                .with_no_client_auth()
                .with_single_cert(self.chain.clone(), self.key.clone_key())?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// A client of the agents' HTTPS.
    pub fn agent_tls(&self) -> ureq::tls::TlsConfig {
        self.agent_tls.clone()
    }

    /// The same for an async client (the console's WebSocket, which ureq
    /// does not speak): only the cluster's authority trusted, HTTP/1.1
    /// (a WebSocket is an upgraded HTTP/1.1 request).
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, CredentialsError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.clone())?;
        let mut config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()?
                .with_root_certificates(roots)
                .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Makes `dir` (mode 0700) if it is not there.
fn make_dir(dir: &Path) -> Result<(), CredentialsError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| FileError::Write { path: dir.into(), source }.into())
}

/// From a day ago (a host's clock a little behind) to `years` from now.
fn validity(params: &mut CertificateParams, years: i64) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(365 * years);
}

/// A new cluster in `dir`: its authority (`ca.pem`, `ca.key`) and its API
/// token. Refuses a directory that already holds one.
pub fn init(dir: &Path) -> Result<(), CredentialsError> {
    make_dir(dir)?;
    for name in [CA_CERT, CA_KEY, TOKEN] {
        if dir.join(name).exists() {
            return Err(invalid(&dir.join(name), "exists: this directory already holds a cluster's authority"));
        }
    }
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, "ftvm cluster authority");
    // It signs hosts' and operators' certificates, never another authority.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    validity(&mut params, CA_YEARS);
    let cert = params.self_signed(&key)?;
    create(&dir.join(CA_KEY), key.serialize_pem().as_bytes(), 0o600)?;
    create(&dir.join(CA_CERT), cert.pem().as_bytes(), 0o644)?;
    crate::authority::token::create(&dir.join(TOKEN)).map_err(CredentialsError::Token)?;
    Ok(())
}

/// What a certificate is for: its name, and the addresses it serves on
/// (none for an operator, who is only ever a client).
#[derive(Debug, Clone)]
pub struct Subject {
    pub name: String,
    pub ips: Vec<IpAddr>,
    pub dns: Vec<String>,
}

/// A credentials directory `out` for `subject`, signed by the authority
/// in `ca_dir`, with the cluster's token. Refuses to write over one.
pub fn issue(ca_dir: &Path, out: &Path, subject: &Subject) -> Result<(), CredentialsError> {
    if subject.name.is_empty() || !subject.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        return Err(CredentialsError::Name(subject.name.clone()));
    }
    let ca_key_path = ca_dir.join(CA_KEY);
    private(&ca_key_path)?;
    let ca_key_pem = String::from_utf8_lossy(&read(&ca_key_path)?).into_owned();
    let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(|e| invalid(&ca_key_path, format!("holds no key: {e}")))?;
    let ca_cert_path = ca_dir.join(CA_CERT);
    let ca_pem = read(&ca_cert_path)?;
    let issuer = Issuer::from_ca_cert_pem(&String::from_utf8_lossy(&ca_pem), ca_key)
        .map_err(|e| invalid(&ca_cert_path, format!("holds no authority's certificate: {e}")))?;
    let token = crate::authority::token::read(&ca_dir.join(TOKEN)).map_err(CredentialsError::Token)?;

    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, subject.name.as_str());
    params.subject_alt_names = subject.ips.iter().map(|ip| SanType::IpAddress(*ip)).collect();
    for name in &subject.dns {
        params.subject_alt_names.push(SanType::DnsName(name.as_str().try_into()?));
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    // Both: a host's agent and etcd member serve, and call other hosts.
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, CERT_YEARS);
    let cert = params.signed_by(&key, &issuer)?;

    make_dir(out)?;
    for name in [CA_CERT, CERT, KEY, TOKEN] {
        if out.join(name).exists() {
            return Err(invalid(&out.join(name), "exists: the directory already holds credentials"));
        }
    }
    create(&out.join(KEY), key.serialize_pem().as_bytes(), 0o600)?;
    create(&out.join(CERT), cert.pem().as_bytes(), 0o644)?;
    create(&out.join(CA_CERT), &ca_pem, 0o644)?;
    create(&out.join(TOKEN), format!("{token}\n").as_bytes(), 0o600)?;
    Ok(())
}

/// Credentials made afresh under the temporary directory, for unit tests.
#[cfg(test)]
pub(crate) fn scratch(name: &str) -> Credentials {
    let base = std::env::temp_dir().join(format!("ftvm-credentials-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    init(&base.join("ca")).unwrap();
    issue(&base.join("ca"), &base.join("host"), &Subject { name: name.into(), ips: vec![], dns: vec![] }).unwrap();
    Credentials::read(&base.join("host")).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_issued_directory_reads_back_and_makes_tls() {
        let base = std::env::temp_dir().join(format!("ftvm-credentials-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (ca, host) = (base.join("ca"), base.join("host"));
        init(&ca).unwrap();
        assert!(init(&ca).is_err(), "a second init over the first");
        let subject = Subject { name: "h1".into(), ips: vec!["10.0.0.1".parse().unwrap()], dns: vec![] };
        issue(&ca, &host, &subject).unwrap();
        assert!(issue(&ca, &host, &subject).is_err(), "issued over existing credentials");
        let creds = Credentials::read(&host).unwrap();
        assert_eq!(creds.token, crate::authority::token::read(&ca.join(TOKEN)).unwrap());
        creds.server_config().unwrap();
        let _ = creds.agent_tls();
        ftvm_etcd::EtcdTls::from_dir(&host).unwrap();
        assert!(issue(&ca, &base.join("bad"), &Subject { name: "a b".into(), ips: vec![], dns: vec![] }).is_err());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
