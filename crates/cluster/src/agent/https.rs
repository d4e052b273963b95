//! The agent's HTTPS server: TCP connections accepted and counted against
//! limits (in all, and per source address), their TLS handshakes done
//! beside the accept loop, each within a deadline and at most
//! [`HANDSHAKES`] at once, and each connection then served by hyper with a
//! deadline for a request's head, which also ends a keep-alive connection
//! left idle that long. So a client that connects and says nothing, says
//! it a byte at a time (slowloris), or a crowd of them from one address,
//! holds up neither the others nor the server (issue 68). The same
//! per-address count, [`PerSource`], bounds the event streams.
//!
//! Written here, not taken from a crate (axum::serve, axum-server,
//! tls-listener): axum::serve gives hyper no timer, so no header
//! deadline, and none of them counts connections by source; the loop is
//! one page over tokio-rustls and hyper, and the limits are the point.

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

/// How long a client has to finish its handshake.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);
/// How many handshakes may be under way at once; a connection beyond
/// them is closed at once.
const HANDSHAKES: usize = 256;
/// How long a client has to send a request's head, from the moment the
/// server waits for one (a new connection, or one kept alive between
/// requests): past it the connection is closed.
pub const HEAD_WITHIN: Duration = Duration::from_secs(10);
/// Connections open at once, in all and from one address; one beyond is
/// closed at once. The agent raises its descriptor limit well past them
/// (`raise_descriptor_limit`): its VMs, etcd and files need some too.
pub const CONNECTIONS: usize = 1024;
pub const CONNECTIONS_PER_SOURCE: usize = 64;
/// How long, once told to stop, the server waits for requests under way
/// (an event stream never ends by itself).
const DRAIN_WITHIN: Duration = Duration::from_secs(5);

/// A count of things held at once (connections, event streams), in all
/// and per source address.
pub struct PerSource {
    all: Arc<Semaphore>,
    per_source: usize,
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One thing counted by a [`PerSource`], given back when dropped.
pub struct Held {
    _all: OwnedSemaphorePermit,
    source: IpAddr,
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl PerSource {
    pub fn new(all: usize, per_source: usize) -> PerSource {
        PerSource { all: Arc::new(Semaphore::new(all)), per_source, held: Arc::default() }
    }

    /// One more for `source`, or None if it holds its share or all are
    /// taken.
    pub fn take(&self, source: IpAddr) -> Option<Held> {
        let mut held = self.held.lock().expect("the counts' lock");
        let n = held.entry(source).or_default();
        if *n >= self.per_source {
            return None;
        }
        let all = self.all.clone().try_acquire_owned().ok()?;
        *n += 1;
        Some(Held { _all: all, source, held: self.held.clone() })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.held.lock().expect("the counts' lock");
        if let Some(n) = held.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.source);
            }
        }
    }
}

/// Raises this process's soft limit of open descriptors to its hard
/// limit: the connections above, each VM's sockets and files.
pub fn raise_descriptor_limit() -> std::io::Result<()> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write `limit`.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        limit.rlim_cur = limit.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Serves `app` over TLS (`config`) on `listener` until `stop` turns
/// true, then lets the requests under way end (at most [`DRAIN_WITHIN`]).
/// Each request carries its client's address ([`ConnectInfo`]).
pub async fn serve(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    app: Router,
    mut stop: watch::Receiver<bool>,
) {
    let acceptor = TlsAcceptor::from(config);
    let handshakes = Arc::new(Semaphore::new(HANDSHAKES));
    let connections = PerSource::new(CONNECTIONS, CONNECTIONS_PER_SOURCE);
    let (draining, drain) = watch::channel(false);
    // Each connection's task holds a sender; when all are dropped, recv
    // answers None: every connection has ended.
    let (open_tx, mut open_rx) = tokio::sync::mpsc::channel::<()>(1);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = async { drop(stop.wait_for(|s| *s).await) } => break,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(_) => {
                    // Out of descriptors, or a connection reset while
                    // queued: wait a little rather than spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(held) = connections.take(peer.ip()) else {
            continue; // dropped: too many from there, or in all
        };
        let Ok(handshake) = handshakes.clone().try_acquire_owned() else {
            continue; // dropped: too many handshakes under way
        };
        let (acceptor, app, mut drain, open) = (acceptor.clone(), app.clone(), drain.clone(), open_tx.clone());
        tokio::spawn(async move {
            let _ = tcp.set_nodelay(true);
            let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_WITHIN, acceptor.accept(tcp)).await else {
                return;
            };
            drop(handshake);
            let app = app.map_request(move |mut request: axum::extract::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                request
            });
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new()).header_read_timeout(HEAD_WITHIN);
            let conn = http.serve_connection(TokioIo::new(tls), TowerToHyperService::new(app)).with_upgrades();
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                // (The guard wait_for answers is not Send: not kept.)
                _ = async { drop(drain.wait_for(|d| *d).await) } => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            drop((held, open));
        });
    }
    let _ = draining.send(true);
    drop(open_tx);
    let _ = tokio::time::timeout(DRAIN_WITHIN, open_rx.recv()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_gets_its_share_and_the_rest_is_left_to_others() {
        let limits = PerSource::new(5, 2);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let a1 = limits.take(a).unwrap();
        let _a2 = limits.take(a).unwrap();
        assert!(limits.take(a).is_none(), "a third for one source");
        let _b1 = limits.take(b).unwrap();
        drop(a1);
        let _a3 = limits.take(a).expect("a share given back is taken again");
        let _b2 = limits.take(b).unwrap();
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        let c1 = limits.take(c).unwrap();
        assert!(limits.take(c).is_none(), "more than all");
        drop(c1);
        assert!(limits.take(c).is_some());
    }
}
