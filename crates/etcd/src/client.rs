//! A blocking etcd client: etcd's own async client (`etcd-client`) driven
//! by a runtime of its own, for callers that are plain threads (the VMM's).
//! Every request has a deadline, so an etcd that lost its quorum, or a
//! member that cannot be reached, is an error the caller can wait out and
//! retry, never a hang.

use crate::endpoints::{Endpoints, REQUEST_TIMEOUT};
use etcd_client::{Client, GetOptions, Txn, TxnResponse};
use std::sync::Mutex;
use std::time::Duration;

/// Pause between the tries of one request.
const RETRY: Duration = Duration::from_millis(50);
/// How long the first try of a request may take on one member before the
/// next try goes to the next member; each later try may take this much
/// more. A member on a host that vanished (no FIN, no RST) never answers:
/// a try bounded by the whole request's timeout would spend it all there,
/// and a backup that asks the arbiter to go live would wait 3 s for the
/// dead primary's own etcd member.
const FIRST_TRY: Duration = Duration::from_millis(400);

#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// An endpoint is not `http://HOST:PORT` (`https://` with TLS).
    #[error("etcd endpoint {0:?} is not http://HOST:PORT or https://HOST:PORT")]
    Endpoint(String),
    /// An `https://` endpoint, and no credentials to speak TLS with.
    #[error("etcd endpoint {0:?} is https: give the cluster's credentials (--credentials DIR)")]
    TlsNeeded(String),
    /// An `http://` endpoint beside credentials: it would be plain.
    #[error("etcd endpoint {0:?} is plain http, and the cluster's etcd speaks TLS: give https://")]
    PlainWithTls(String),
    /// The credentials for etcd's TLS cannot be read.
    #[error("etcd's TLS: {0}")]
    Tls(String),
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
    endpoints: Endpoints,
    runtime: tokio::runtime::Runtime,
    /// Connected on first use, to one member, and again, to the next
    /// member, after a failed try.
    client: Mutex<Option<Client>>,
    /// The member the next connection goes to (an index into `endpoints`).
    member: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Etcd({})", self.endpoints.joined())
    }
}

impl Etcd {
    /// A client of the cluster at `endpoints`; nothing is contacted yet.
    pub fn new(endpoints: Endpoints) -> Result<Etcd, EtcdError> {
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
        self.endpoints.joined()
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
        let options = self.endpoints.options();
        // One member at a time, rather than etcd-client's balance over
        // all: a try that fails moves to the next member for certain.
        let urls = self.endpoints.urls();
        let member = self.member.load(std::sync::atomic::Ordering::Relaxed) % urls.len();
        let endpoints = vec![urls[member].clone()];
        let connect = async move { tokio::time::timeout_at(until, Client::connect(endpoints, Some(options))).await };
        let client = match self.runtime.block_on(connect) {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(self.error(e)),
            Err(_) => return Err(self.error(format!("member {} did not answer in time", urls[member]))),
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
