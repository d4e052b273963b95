//! What can go wrong opening either end of the logging channel, or asking
//! the primary something through it. A peer that fails once the channel
//! runs is no error of a call: it is a [`Failure`](super::Failure),
//! declared to whoever listens.

use super::wire::MAX_REQUEST;
use std::net::SocketAddr;

/// Why an end of the channel could not be opened or started.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// Nothing accepted a connection at the backup's logging address
    /// within the wait.
    #[error("cannot reach the backup at {backup}: {source}")]
    Unreachable {
        backup: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// A call on the channel's socket failed: accepting the connection,
    /// setting it up, or cloning its handle for another thread.
    #[error("logging channel: {0}")]
    Socket(#[source] std::io::Error),
    /// The backup's end did not complete the handshake: it does not hold
    /// the pair's key, or did not answer.
    #[error("no protected channel with the backup at {peer}: {source}")]
    Handshake {
        peer: SocketAddr,
        #[source]
        source: super::secure::HandshakeError,
    },
    /// One of the channel's threads could not be started.
    #[error("{thread}: {source}")]
    Thread {
        thread: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// A request larger than a primary takes ([`MAX_REQUEST`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a request of {len} bytes to the primary (at most {MAX_REQUEST})")]
pub struct RequestTooLarge {
    /// The request's length in bytes.
    pub len: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    #[test]
    fn messages_name_what_failed_and_why() {
        let refused = || Error::new(ErrorKind::ConnectionRefused, "refused");
        let backup: SocketAddr = "127.0.0.2:7000".parse().unwrap();
        assert_eq!(
            ChannelError::Unreachable { backup, source: refused() }.to_string(),
            "cannot reach the backup at 127.0.0.2:7000: refused"
        );
        assert_eq!(ChannelError::Socket(refused()).to_string(), "logging channel: refused");
        assert_eq!(ChannelError::Thread { thread: "ft-detect", source: refused() }.to_string(), "ft-detect: refused");
        assert_eq!(
            RequestTooLarge { len: MAX_REQUEST + 1 }.to_string(),
            format!("a request of {} bytes to the primary (at most {MAX_REQUEST})", MAX_REQUEST + 1)
        );
        let e = ChannelError::Socket(refused());
        assert_eq!(std::error::Error::source(&e).unwrap().to_string(), "refused");
    }
}
