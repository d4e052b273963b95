//! A blocking etcd client: etcd's own async client (`etcd-client`) driven
//! by a runtime of its own, for callers that are plain threads (the VMM's).
//! Every request has a deadline, so an etcd that lost its quorum, or a
//! member that cannot be reached, is an error the caller can wait out and
//! retry, never a hang.

use etcd_client::{Client, ConnectOptions, GetOptions, Txn, TxnResponse};
use std::sync::Mutex;
use std::time::Duration;

/// How long one request may take. A write needs a majority of the members;
/// without one, etcd never answers and this bounds the wait.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// Pause between the tries of one request.
const RETRY: Duration = Duration::from_millis(50);
/// How long the first try of a request may take on one member before the
/// next try goes to the next member; each later try may take this much
/// more. A member on a host that vanished (no FIN, no RST) never answers:
/// a try bounded by the whole request's timeout would spend it all there,
/// and a backup that asks the arbiter to go live would wait 3 s for the
/// dead primary's own etcd member.
const FIRST_TRY: Duration = Duration::from_millis(400);
/// How long connecting to the members may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// An endpoint is not `http://HOST:PORT`.
    #[error("etcd endpoint {0:?} is not http://HOST:PORT")]
    Endpoint(String),
    /// No endpoint was given.
    #[error("no etcd endpoint given")]
    NoEndpoint,
    /// The async runtime could not be made.
    #[error("cannot start etcd's client: {0}")]
    Runtime(String),
    /// etcd refused or did not answer in time (no quorum, unreachable).
    #[error("etcd at {endpoints}: {problem}")]
    Request { endpoints: String, problem: String },
}

/// A blocking client of one etcd cluster.
pub struct Etcd {
    endpoints: Vec<String>,
    runtime: tokio::runtime::Runtime,
    /// Connected on first use, to one member, and again, to the next
    /// member, after a failed try.
    client: Mutex<Option<Client>>,
    /// The member the next connection goes to (an index into `endpoints`).
    member: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Etcd({})", self.endpoints.join(","))
    }
}

/// `http://host:port,http://host:port` (or `host:port`, taken as http) to
/// a list of endpoints.
pub fn parse_endpoints(list: &str) -> Result<Vec<String>, EtcdError> {
    let mut out = Vec::new();
    for e in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let rest = e.strip_prefix("http://").unwrap_or(e);
        let ok = match rest.rsplit_once(':') {
            Some((host, port)) => !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok_and(|p| p > 0),
            None => false,
        };
        if !ok || e.contains("://") && !e.starts_with("http://") {
            return Err(EtcdError::Endpoint(e.to_string()));
        }
        out.push(format!("http://{rest}"));
    }
    if out.is_empty() {
        return Err(EtcdError::NoEndpoint);
    }
    Ok(out)
}

impl Etcd {
    /// A client of the cluster at `endpoints` (see [`parse_endpoints`]);
    /// nothing is contacted yet.
    pub fn new(endpoints: &str) -> Result<Etcd, EtcdError> {
        let endpoints = parse_endpoints(endpoints)?;
        // One worker: the requests are few and small; `block_on` from any
        // thread hands its future to the runtime's own.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("etcd-client")
            .enable_all()
            .build()
            .map_err(|e| EtcdError::Runtime(e.to_string()))?;
        Ok(Etcd { endpoints, runtime, client: Mutex::new(None), member: Default::default() })
    }

    /// The endpoints, comma-separated, as messages name the cluster.
    pub fn endpoints(&self) -> String {
        self.endpoints.join(",")
    }

    fn error(&self, problem: impl std::fmt::Display) -> EtcdError {
        EtcdError::Request { endpoints: self.endpoints(), problem: problem.to_string() }
    }

    /// A connected client (connecting if need be, by `until`).
    fn client(&self, until: tokio::time::Instant) -> Result<Client, EtcdError> {
        let mut held = self.client.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = &*held {
            return Ok(c.clone());
        }
        let options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT)
            // A member cut off from the others answers at once that it
            // has no leader, rather than after the timeout.
            .with_require_leader(true);
        // One member at a time, rather than etcd-client's balance over
        // all: a try that fails moves to the next member for certain.
        let member = self.member.load(std::sync::atomic::Ordering::Relaxed) % self.endpoints.len();
        let endpoints = vec![self.endpoints[member].clone()];
        let connect = async move { tokio::time::timeout_at(until, Client::connect(endpoints, Some(options))).await };
        let client = match self.runtime.block_on(connect) {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(self.error(e)),
            Err(_) => return Err(self.error(format!("member {} did not answer in time", self.endpoints[member]))),
        };
        *held = Some(client.clone());
        Ok(client)
    }

    /// Runs one request, trying again (connecting anew, to the next
    /// member) while it fails, until the deadline: a member's death or a
    /// new leader's election fails a try or two, which is not yet "etcd
    /// cannot be reached". Each try has a bound of its own (growing, as a
    /// loaded member may be slow rather than gone). A retried write may
    /// have been applied by the try whose answer was lost: each write here
    /// is a transaction that reads the same on a second try.
    fn request<T, F>(&self, f: impl Fn(Client) -> F) -> Result<T, EtcdError>
    where
        F: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
        let mut last = None;
        let mut tries = 0u32;
        while tokio::time::Instant::now() < deadline {
            tries += 1;
            let this_try = (tokio::time::Instant::now() + FIRST_TRY * tries).min(deadline);
            let result = self.client(this_try).and_then(|client| {
                match self.runtime.block_on(async { tokio::time::timeout_at(this_try, f(client)).await }) {
                    Ok(Ok(v)) => Ok(v),
                    Ok(Err(e)) => Err(self.error(e)),
                    Err(_) => Err(self.error("no answer within the request timeout (no quorum?)")),
                }
            });
            match result {
                Ok(v) => return Ok(v),
                Err(e) => last = Some(e),
            }
            *self.client.lock().unwrap_or_else(|e| e.into_inner()) = None;
            self.member.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::thread::sleep(RETRY);
        }
        Err(last.unwrap_or_else(|| self.error("no answer within the request timeout (no quorum?)")))
    }

    /// The value at `key`, if there is one.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, EtcdError> {
        let key = key.to_string();
        let resp = self.request(|mut c| {
            let key = key.clone();
            async move { c.get(key, None).await }
        })?;
        Ok(resp.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// The value at `key` and its modification revision (for a
    /// transaction that writes only if nobody wrote since), if there is one.
    pub fn get_versioned(&self, key: &str) -> Result<Option<(Vec<u8>, i64)>, EtcdError> {
        let key = key.to_string();
        let resp = self.request(|mut c| {
            let key = key.clone();
            async move { c.get(key, None).await }
        })?;
        Ok(resp.kvs().first().map(|kv| (kv.value().to_vec(), kv.mod_revision())))
    }

    /// The keys and values under `prefix`, sorted by key; at most `limit`
    /// of them from the end when `last` (0: all).
    pub fn get_prefix(&self, prefix: &str, last: i64) -> Result<Vec<(String, Vec<u8>)>, EtcdError> {
        let prefix = prefix.to_string();
        let resp = self.request(|mut c| {
            let prefix = prefix.clone();
            async move {
                let mut opts = GetOptions::new().with_prefix();
                if last > 0 {
                    opts =
                        opts.with_sort(etcd_client::SortTarget::Key, etcd_client::SortOrder::Descend).with_limit(last);
                }
                c.get(prefix, Some(opts)).await
            }
        })?;
        let mut out: Vec<(String, Vec<u8>)> =
            resp.kvs().iter().map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.value().to_vec())).collect();
        out.sort();
        Ok(out)
    }

    /// The keys, values and modification revisions under `prefix` written
    /// after revision `after`, in the order they were written.
    pub fn get_prefix_since(&self, prefix: &str, after: i64) -> Result<Vec<(String, Vec<u8>, i64)>, EtcdError> {
        let prefix = prefix.to_string();
        let resp = self.request(|mut c| {
            let prefix = prefix.clone();
            async move {
                let opts = GetOptions::new().with_prefix().with_min_mod_revision(after + 1);
                c.get(prefix, Some(opts)).await
            }
        })?;
        let mut out: Vec<(String, Vec<u8>, i64)> = resp
            .kvs()
            .iter()
            .map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.value().to_vec(), kv.mod_revision()))
            .collect();
        out.sort_by_key(|(_, _, r)| *r);
        Ok(out)
    }

    /// The keys under `prefix` and their modification revisions, without
    /// their values (for deciding what to delete).
    pub fn keys_prefix(&self, prefix: &str) -> Result<Vec<(String, i64)>, EtcdError> {
        let prefix = prefix.to_string();
        let resp = self.request(|mut c| {
            let prefix = prefix.clone();
            async move { c.get(prefix, Some(GetOptions::new().with_prefix().with_keys_only())).await }
        })?;
        Ok(resp.kvs().iter().map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.mod_revision())).collect())
    }

    /// Runs a transaction.
    pub fn txn(&self, txn: Txn) -> Result<TxnResponse, EtcdError> {
        self.request(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_http_host_port() {
        assert_eq!(parse_endpoints("10.0.0.1:2379").unwrap(), vec!["http://10.0.0.1:2379"]);
        assert_eq!(
            parse_endpoints("http://a:1, http://b:2").unwrap(),
            vec!["http://a:1".to_string(), "http://b:2".to_string()]
        );
        for bad in ["", ",", "a", "a:0", "a:x", "https://a:1", "ftp://a:1", ":1", "http://a:1/x"] {
            assert!(parse_endpoints(bad).is_err(), "{bad:?}");
        }
    }
}
