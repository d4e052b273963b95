//! The agent's async connections to etcd: every request with a deadline,
//! and a member without a leader answering at once rather than after it;
//! a connection with a lease of its own, renewed by its owner's loop (the
//! host's record and the controller's key are each held under one); and
//! the one write of a shared value an agent's request needs at once (a
//! VM's pair key, [`create_or_read`]).
//!
//! A connection goes to one member; after a failed request its owner
//! reconnects to the next one ([`Leased::reconnect`], [`next_member`]).
//! etcd-client balances over every endpoint it is given and keeps sending
//! a share of the requests to a member that is down, so a dead member (a
//! host that died with its agent) failed a request in three and cost the
//! controller its key every few seconds. A lease outlives its connection:
//! a reconnected session renews the same lease, and only a lease that
//! expired while etcd was away makes its owner open a new session.

use etcd_client::{Client, Compare, CompareOp, Error, PutOptions, Txn, TxnOp};
use ftvm_etcd::Endpoints;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// What a request of a session can fail with: etcd's client's error.
pub type SessionError = Error;

/// The member this process connects to next (an index into the
/// endpoints; moved on by a failure).
static MEMBER: AtomicUsize = AtomicUsize::new(0);

/// After a failed request: the next connection goes to the next member.
pub fn next_member() {
    MEMBER.fetch_add(1, Ordering::Relaxed);
}

/// A client of one member of the cluster at `endpoints` (the one in turn).
pub async fn connect(endpoints: &Endpoints) -> Result<Client, Error> {
    let urls = endpoints.urls();
    let member = urls.get(MEMBER.load(Ordering::Relaxed) % urls.len().max(1));
    Client::connect(member.into_iter().collect::<Vec<_>>(), Some(endpoints.options())).await
}

/// A client and a lease it holds.
pub struct Leased {
    pub client: Client,
    pub lease: i64,
    endpoints: Endpoints,
    /// The last renewal found the lease gone (it expired while etcd was
    /// away): what it held is gone, and a new session is needed.
    pub expired: bool,
}

impl Leased {
    /// Connects and takes a lease of `ttl`.
    pub async fn open(endpoints: &Endpoints, ttl: Duration) -> Result<Leased, Error> {
        let mut client = connect(endpoints).await?;
        let lease = client.lease_grant(ttl.as_secs() as i64, None).await?.id();
        Ok(Leased { client, lease, endpoints: endpoints.clone(), expired: false })
    }

    /// Renews the lease once.
    pub async fn renew(&mut self) -> Result<(), Error> {
        let (mut keeper, mut responses) = match self.client.lease_keep_alive(self.lease).await {
            Ok(stream) => stream,
            // etcd-client opens the stream with a first keep-alive and
            // answers a lease that is gone (a TTL of 0) with this error,
            // which it also gives for a failure of its own: etcd is asked
            // plainly, and a lease it no longer has (a TTL of -1) is
            // expired. Taken for a passing failure, the owner renewed the
            // dead lease for ever: the host's record never came back.
            Err(Error::LeaseKeepAliveError(why)) => {
                if self.client.lease_time_to_live(self.lease, None).await?.ttl() <= 0 {
                    self.expired = true;
                }
                return Err(Error::LeaseKeepAliveError(why));
            }
            Err(e) => return Err(e),
        };
        keeper.keep_alive().await?;
        match responses.message().await? {
            Some(r) if r.ttl() > 0 => Ok(()),
            // A TTL of 0: it expired while etcd was away.
            _ => {
                self.expired = true;
                Err(Error::LeaseKeepAliveError("the lease expired".into()))
            }
        }
    }

    /// Writes `value` at `key` under the lease: it goes when the lease
    /// does.
    pub async fn put(&mut self, key: &str, value: &str) -> Result<(), Error> {
        self.client.put(key, value, Some(PutOptions::new().with_lease(self.lease))).await?;
        Ok(())
    }

    /// Takes `key` (writing `value` there under the lease) if nobody holds
    /// it; then whether this lease holds it.
    pub async fn claim(&mut self, key: &str, value: &str) -> Result<bool, Error> {
        let txn = Txn::new().when([Compare::create_revision(key, CompareOp::Equal, 0)]).and_then([TxnOp::put(
            key,
            value,
            Some(PutOptions::new().with_lease(self.lease)),
        )]);
        self.client.txn(txn).await?;
        let holder = self.client.get(key, None).await?;
        Ok(holder.kvs().first().is_some_and(|kv| kv.lease() == self.lease))
    }

    /// After a failed request: the same lease, through the next member.
    pub async fn reconnect(&mut self) -> Result<(), Error> {
        next_member();
        self.client = connect(&self.endpoints).await?;
        Ok(())
    }

    /// Gives the lease back: what it held goes at once.
    pub async fn revoke(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(3), self.client.lease_revoke(self.lease)).await;
    }
}

/// What an owner's loop does with its session after a failed request:
/// keep it (reconnected to the next member) unless its lease is gone.
pub async fn after_failure(session: &mut Option<Leased>) {
    match session {
        Some(s) if !s.expired => {
            if s.reconnect().await.is_err() {
                *session = None;
            }
        }
        _ => {
            next_member();
            *session = None;
        }
    }
}

/// The value at `key`, written first as `value` if there was none (so
/// two agents racing agree on one). Each member in turn until one
/// answers (a dead one fails its try).
pub async fn create_or_read(endpoints: &Endpoints, key: &str, value: &[u8]) -> Result<Vec<u8>, CreateOrReadError> {
    let mut result = Err(CreateOrReadError::NoMember);
    for _ in 0..endpoints.urls().len() {
        // A member that cannot be connected to ends it; one that fails
        // the request passes it to the next.
        let mut client = connect(endpoints).await?;
        result = async {
            let txn = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key, value, None)]);
            client.txn(txn).await?;
            let got = client.get(key, None).await?;
            got.kvs().first().map(|kv| kv.value().to_vec()).ok_or(CreateOrReadError::Vanished)
        }
        .await;
        if result.is_ok() {
            break;
        }
        next_member();
    }
    result
}

#[derive(Debug, thiserror::Error)]
pub enum CreateOrReadError {
    #[error("{0}")]
    Etcd(#[from] Error),
    #[error("no etcd member")]
    NoMember,
    /// Deleted between its write and its read.
    #[error("it vanished from etcd")]
    Vanished,
}
