//! The agent's HTTPS listener: TCP connections accepted and their TLS
//! handshakes done beside the accept loop, each within a deadline and at
//! most [`HANDSHAKES`] at once, so a client that connects and says nothing
//! (or a crowd of them) holds up neither the others nor the server. The
//! server (axum) takes only connections whose handshake succeeded.
//!
//! Written here, not taken from a crate (axum-server, tls-listener): it
//! is this one loop over tokio-rustls, and the limits are the point.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client has to finish its handshake.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);
/// How many handshakes may be under way at once; a connection beyond
/// them is closed at once.
const HANDSHAKES: usize = 256;

/// Connections that finished their handshake, in the order they did.
pub struct TlsListener {
    local: SocketAddr,
    ready: tokio::sync::mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl TlsListener {
    /// Serves TLS with `config` on `listener` (the accepting runs as a
    /// task until the listener is dropped).
    pub fn new(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (tx, ready) = tokio::sync::mpsc::channel(HANDSHAKES);
        let acceptor = TlsAcceptor::from(config);
        let slots = Arc::new(tokio::sync::Semaphore::new(HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(_) => {
                        // Out of descriptors, or a connection reset while
                        // queued: wait a little rather than spin.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    continue; // dropped: too many handshakes under way
                };
                let (acceptor, done) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let _ = tcp.set_nodelay(true);
                    if let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_WITHIN, acceptor.accept(tcp)).await {
                        drop(slot);
                        let _ = done.send((tls, peer)).await;
                    }
                });
                if tx.is_closed() {
                    return;
                }
            }
        });
        Ok(TlsListener { local, ready })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accepting task ended: its listener failed for good.
            // Never returning leaves the server to its graceful shutdown.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
