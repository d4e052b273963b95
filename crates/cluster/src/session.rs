//! The agent's connections to etcd: every request with a deadline, and a
//! member without a leader answering at once rather than after it; and a
//! connection with a lease of its own, renewed by its owner's loop (the
//! host's record and the controller's key are each held under one). A
//! lease that expired while etcd was away is an error: its owner opens a
//! new session.

use etcd_client::{Client, ConnectOptions, Error};
use std::time::Duration;

/// A client of the cluster's etcd at `endpoints`.
pub async fn connect(endpoints: &[String]) -> Result<Client, Error> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(3))
        .with_require_leader(true);
    Client::connect(endpoints, Some(options)).await
}

/// A client and a lease it holds.
pub struct Leased {
    pub client: Client,
    pub lease: i64,
}

impl Leased {
    /// Connects and takes a lease of `ttl`.
    pub async fn open(endpoints: &[String], ttl: Duration) -> Result<Leased, Error> {
        let mut client = connect(endpoints).await?;
        let lease = client.lease_grant(ttl.as_secs() as i64, None).await?.id();
        Ok(Leased { client, lease })
    }

    /// Renews the lease once.
    pub async fn renew(&mut self) -> Result<(), Error> {
        let (mut keeper, mut responses) = self.client.lease_keep_alive(self.lease).await?;
        keeper.keep_alive().await?;
        match responses.message().await? {
            Some(r) if r.ttl() > 0 => Ok(()),
            // A TTL of 0: it expired while etcd was away.
            _ => Err(Error::LeaseKeepAliveError("the lease expired".into())),
        }
    }

    /// Gives the lease back: what it held goes at once.
    pub async fn revoke(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(3), self.client.lease_revoke(self.lease)).await;
    }
}
