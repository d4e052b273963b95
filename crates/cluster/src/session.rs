//! The agent's connections to etcd: every request with a deadline, and a
//! member without a leader answering at once rather than after it; and a
//! connection with a lease of its own, renewed by its owner's loop (the
//! host's record and the controller's key are each held under one).
//!
//! A connection goes to one member; after a failed request its owner
//! reconnects to the next one ([`Leased::reconnect`], [`next_member`]).
//! etcd-client balances over every endpoint it is given and keeps sending
//! a share of the requests to a member that is down, so a dead member (a
//! host that died with its agent) failed a request in three and cost the
//! controller its key every few seconds. A lease outlives its connection:
//! a reconnected session renews the same lease, and only a lease that
//! expired while etcd was away makes its owner open a new session.

use etcd_client::{Client, Error};
use ftvm_etcd::Endpoints;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

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
