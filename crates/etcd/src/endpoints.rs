//! Where etcd is and how to reach it: its members' URLs and, for a
//! cluster whose etcd speaks TLS, the certificate ftvm shows etcd and the
//! authority it trusts for etcd's own. Every connection ftvm makes to
//! etcd starts from [`Endpoints::options`], so none can forget the TLS.
//!
//! The files are a credentials directory's (`ftvm cluster issue`): `ca.pem`
//! (the cluster's authority), `cert.pem` and `key.pem` (this host's or
//! this operator's identity, signed by it).

use crate::client::EtcdError;
use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How long connecting to a member may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one request may take. A write needs a majority of the members;
/// without one, etcd never answers and this bounds the wait.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// The TLS side of a connection to etcd: the authority etcd's certificate
/// must be signed by, and the client certificate etcd asks for.
#[derive(Clone)]
pub struct EtcdTls {
    ca: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.write_str("EtcdTls")
    }
}

impl EtcdTls {
    /// Of PEM texts already read and checked: the authority's
    /// certificate, the client's certificate (chain) and its key.
    pub fn new(ca: Vec<u8>, cert: Vec<u8>, key: Vec<u8>) -> EtcdTls {
        EtcdTls { ca, cert, key }
    }

    /// The files of the credentials directory `dir`.
    pub fn from_dir(dir: &Path) -> Result<EtcdTls, EtcdError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).map_err(|e| EtcdError::Tls(format!("cannot read {}: {e}", path.display())))
        };
        let tls = EtcdTls { ca: read("ca.pem")?, cert: read("cert.pem")?, key: read("key.pem")? };
        for (name, pem, label) in
            [("ca.pem", &tls.ca, "CERTIFICATE"), ("cert.pem", &tls.cert, "CERTIFICATE"), ("key.pem", &tls.key, "KEY")]
        {
            if !String::from_utf8_lossy(pem).contains(&format!("{label}-----")) {
                return Err(EtcdError::Tls(format!("{} holds no PEM {label}", dir.join(name).display())));
            }
        }
        Ok(tls)
    }
}

/// etcd's members and how to reach them.
#[derive(Clone, Debug)]
pub struct Endpoints {
    urls: Vec<String>,
    tls: Option<Arc<EtcdTls>>,
}

impl Endpoints {
    /// `SCHEME://host:port,...` (or `host:port`, the scheme then following
    /// `tls`): `https` with TLS, `http` without; a list that mixes them,
    /// or an `https` one without TLS, is refused rather than half secured.
    pub fn parse(list: &str, tls: Option<EtcdTls>) -> Result<Endpoints, EtcdError> {
        let scheme = if tls.is_some() { "https://" } else { "http://" };
        let mut urls = Vec::new();
        for e in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let rest = match e.split_once("://") {
                None => e,
                Some(_) if e.starts_with(scheme) => &e[scheme.len()..],
                Some(("https", _)) => return Err(EtcdError::TlsNeeded(e.to_string())),
                Some(("http", _)) => return Err(EtcdError::PlainWithTls(e.to_string())),
                Some(_) => return Err(EtcdError::Endpoint(e.to_string())),
            };
            let ok = match rest.rsplit_once(':') {
                Some((host, port)) => {
                    !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok_and(|p| p > 0)
                }
                None => false,
            };
            if !ok {
                return Err(EtcdError::Endpoint(e.to_string()));
            }
            urls.push(format!("{scheme}{rest}"));
        }
        if urls.is_empty() {
            return Err(EtcdError::NoEndpoint);
        }
        Ok(Endpoints { urls, tls: tls.map(Arc::new) })
    }

    /// The members' URLs.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// The URLs, comma-separated (as `--etcd` takes them, and as messages
    /// name the cluster).
    pub fn joined(&self) -> String {
        self.urls.join(",")
    }

    /// Whether connections are TLS.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The same cluster with its URLs in another order (`order` returns
    /// the key each URL sorts by).
    #[must_use]
    pub fn sorted_by_key<K: Ord>(&self, order: impl FnMut(&String) -> K) -> Endpoints {
        let mut urls = self.urls.clone();
        urls.sort_by_key(order);
        Endpoints { urls, tls: self.tls.clone() }
    }

    /// The options every connection to etcd is made with: its deadlines,
    /// a member without a leader answering at once rather than after the
    /// deadline, and the TLS.
    pub fn options(&self) -> ConnectOptions {
        let options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT)
            .with_require_leader(true);
        match &self.tls {
            None => options,
            Some(tls) => options.with_tls(
                TlsOptions::new()
                    .ca_certificate(Certificate::from_pem(&tls.ca))
                    .identity(Identity::from_pem(&tls.cert, &tls.key)),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls() -> EtcdTls {
        EtcdTls { ca: vec![], cert: vec![], key: vec![] }
    }

    #[test]
    fn endpoints_are_scheme_host_port() {
        assert_eq!(Endpoints::parse("10.0.0.1:2379", None).unwrap().urls(), ["http://10.0.0.1:2379"]);
        assert_eq!(Endpoints::parse("http://a:1, http://b:2", None).unwrap().urls(), ["http://a:1", "http://b:2"]);
        assert_eq!(Endpoints::parse("a:1,https://b:2", Some(tls())).unwrap().urls(), ["https://a:1", "https://b:2"]);
        for bad in ["", ",", "a", "a:0", "a:x", "ftp://a:1", ":1", "http://a:1/x"] {
            assert!(Endpoints::parse(bad, None).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn tls_and_scheme_must_agree() {
        assert!(matches!(Endpoints::parse("https://a:1", None), Err(EtcdError::TlsNeeded(_))));
        assert!(matches!(Endpoints::parse("https://a:1,http://b:2", Some(tls())), Err(EtcdError::PlainWithTls(_))));
    }
}
