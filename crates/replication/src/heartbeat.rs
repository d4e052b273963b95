//! UDP heartbeats between the two hosts of a pair (VMware FT §2.3). A
//! thread sends a small datagram to the peer every interval and notes
//! when the peer's last one arrived; the failure detectors of the logging
//! channel read that time. Datagrams from other addresses or of another
//! pair (generation) are ignored.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MAGIC: &[u8; 4] = b"FTHB";

/// Why the heartbeats could not start.
#[derive(Debug, thiserror::Error)]
pub enum HeartbeatError {
    /// The local address to beat from could not be bound.
    #[error("cannot bind the heartbeat address {local}: {source}")]
    Bind {
        local: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The bound socket could not be set up.
    #[error("heartbeat socket: {0}")]
    Socket(#[source] std::io::Error),
    /// The thread that beats and listens could not be started.
    #[error("cannot start the heartbeat thread: {0}")]
    Thread(#[source] std::io::Error),
}

pub struct Heartbeat {
    shared: Arc<Shared>,
}

struct Shared {
    start: Instant,
    /// Microseconds after `start` when the peer was last heard; 0: never.
    last_heard_us: AtomicU64,
    stop: AtomicBool,
}

impl Heartbeat {
    /// Binds `local` and beats to `peer` every `interval`.
    pub fn start(
        local: SocketAddr,
        peer: SocketAddr,
        generation: u64,
        interval: Duration,
    ) -> Result<Heartbeat, HeartbeatError> {
        let sock = UdpSocket::bind(local).map_err(|source| HeartbeatError::Bind { local, source })?;
        sock.set_read_timeout(Some(interval.max(Duration::from_millis(1)))).map_err(HeartbeatError::Socket)?;
        let shared =
            Arc::new(Shared { start: Instant::now(), last_heard_us: AtomicU64::new(0), stop: AtomicBool::new(false) });
        let s = shared.clone();
        std::thread::Builder::new()
            .name("ft-heartbeat".into())
            .spawn(move || beat(sock, peer, generation, interval, s))
            .map_err(HeartbeatError::Thread)?;
        Ok(Heartbeat { shared })
    }

    /// How long since the peer's last heartbeat (since start if never).
    pub fn silence(&self) -> Duration {
        let heard = self.shared.last_heard_us.load(Ordering::Relaxed);
        self.shared.start.elapsed().saturating_sub(Duration::from_micros(heard))
    }

    /// Whether the peer has been heard at all.
    pub fn heard(&self) -> bool {
        self.shared.last_heard_us.load(Ordering::Relaxed) != 0
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

fn beat(sock: UdpSocket, peer: SocketAddr, generation: u64, interval: Duration, s: Arc<Shared>) {
    let mut msg = [0u8; 12];
    msg[..4].copy_from_slice(MAGIC);
    msg[4..].copy_from_slice(&generation.to_le_bytes());
    let mut next = Instant::now();
    let mut buf = [0u8; 64];
    while !s.stop.load(Ordering::Relaxed) {
        if Instant::now() >= next {
            // A lost or refused beat is what the peer's detector is for.
            let _ = sock.send_to(&msg, peer);
            next += interval;
            if next < Instant::now() {
                next = Instant::now() + interval;
            }
        }
        let wait = next.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let _ = sock.set_read_timeout(Some(wait));
        if let Ok((n, from)) = sock.recv_from(&mut buf) {
            if from.ip() == peer.ip() && n == msg.len() && buf[..n] == msg {
                let us = s.start.elapsed().as_micros().max(1) as u64;
                s.last_heard_us.store(us, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_ends_hear_each_other_and_notice_silence() {
        let a_addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        // Fixed ports are needed so each knows the other; pick free ones.
        let pa = UdpSocket::bind(a_addr).unwrap().local_addr().unwrap();
        let pb = UdpSocket::bind(a_addr).unwrap().local_addr().unwrap();
        let iv = Duration::from_millis(10);
        let a = Heartbeat::start(pa, pb, 7, iv).unwrap();
        let b = Heartbeat::start(pb, pa, 7, iv).unwrap();
        // Heartbeats every 10 ms keep the silence short: seen within 5 s,
        // as a loaded host may not run the heartbeat threads at once.
        let started = std::time::Instant::now();
        while !(a.heard() && b.heard() && a.silence() < Duration::from_millis(60)) {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "heard {} {}, silence {:?}",
                a.heard(),
                b.heard(),
                a.silence()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(b);
        std::thread::sleep(Duration::from_millis(200));
        assert!(a.silence() >= Duration::from_millis(150), "{:?}", a.silence());
    }

    #[test]
    fn an_address_in_use_is_an_error_that_names_it() {
        let taken = UdpSocket::bind("127.0.0.1:0").unwrap();
        let local = taken.local_addr().unwrap();
        let e = Heartbeat::start(local, local, 1, Duration::from_millis(10)).err().expect("bound twice");
        assert!(matches!(&e, HeartbeatError::Bind { local: l, .. } if *l == local), "{e:?}");
        assert!(e.to_string().starts_with(&format!("cannot bind the heartbeat address {local}: ")), "{e}");
    }

    #[test]
    fn another_generation_is_not_heard() {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let pa = UdpSocket::bind(any).unwrap().local_addr().unwrap();
        let pb = UdpSocket::bind(any).unwrap().local_addr().unwrap();
        let iv = Duration::from_millis(10);
        let a = Heartbeat::start(pa, pb, 1, iv).unwrap();
        let _b = Heartbeat::start(pb, pa, 2, iv).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(!a.heard());
    }
}
