//! UDP heartbeats between the two hosts of a pair (VMware FT §2.3). A
//! thread sends a small datagram to the peer every interval and notes
//! when the peer's last one arrived; the failure detectors of the logging
//! channel read that time.
//!
//! A heartbeat keeps a dead primary's backup from taking over, so one
//! that anybody could send would let an attacker hold a failover off.
//! Each carries the pair's generation, a sequence number, and a MAC over
//! both (keyed BLAKE3 under a key derived from the pair key); a beat is
//! heard only from the peer's address, with a valid MAC, of this
//! generation, and with a sequence number above the last one heard, so
//! forged, altered, replayed or stale beats are all ignored. The sequence
//! starts at the sender's clock in microseconds, so a restarted sender
//! does not start below where it was.
//!
//! ```text
//! "FTH2" | generation u64 LE | sequence u64 LE | MAC (32 bytes) over the first 20
//! ```

use crate::adaptive::ArrivalGaps;
use crate::pair_key::PairKey;
use crate::LiveTiming;
use std::collections::VecDeque;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 4] = b"FTH2";
const SIGNED: usize = 20;
const BEAT_LEN: usize = SIGNED + 32;

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
    /// The sequence number of the peer's last beat heard; 0: none.
    heard_seq: AtomicU64,
    /// Our recent beats: (sequence number, CLOCK_BOOTTIME ns when sent),
    /// oldest first, for the fence's lease (see `fence`).
    sent: Mutex<VecDeque<(u64, u64)>>,
    /// The gaps between the peer's beats, which the timeout is learned from.
    gaps: ArrivalGaps,
    stop: AtomicBool,
}

/// Beats remembered with their send times: at 10 a timeout, many
/// timeouts' worth, far more than an acknowledgement lags behind.
const SENT_KEPT: usize = 1024;

/// What others may ask of a running heartbeat, without owning it (the
/// heartbeat stops when its [`Heartbeat`] is dropped, not this).
#[derive(Clone)]
pub struct HeartbeatLog(Arc<Shared>);

impl HeartbeatLog {
    /// The sequence number of the peer's last beat heard (0: none yet).
    pub fn heard_seq(&self) -> u64 {
        self.0.heard_seq.load(Ordering::Acquire)
    }

    /// The heartbeat timeout learned from the peer's beats (see
    /// [`Heartbeat::timeout`]).
    pub fn timeout(&self, timing: crate::Timing) -> Duration {
        self.0.gaps.timeout(timing, Instant::now())
    }

    /// When we sent our beat `seq` (CLOCK_BOOTTIME ns), if it is recent.
    pub fn sent_at(&self, seq: u64) -> Option<u64> {
        let sent = self.0.sent.lock().unwrap_or_else(|e| e.into_inner());
        let i = sent.binary_search_by_key(&seq, |&(s, _)| s).ok()?;
        Some(sent[i].1)
    }
}

impl Heartbeat {
    /// Binds `local` and beats to `peer` every interval of `timing` (as
    /// it is at each beat), under `key`.
    pub fn start(
        local: SocketAddr,
        peer: SocketAddr,
        generation: u64,
        timing: impl Into<LiveTiming>,
        key: &PairKey,
    ) -> Result<Heartbeat, HeartbeatError> {
        let timing = timing.into();
        let interval = timing.get().interval;
        // A heartbeat of this side's previous pair (a backup that just
        // went live and is protected again) lets its socket go within an
        // interval of being dropped: the address may be taken until then.
        let until = Instant::now() + interval.max(Duration::from_millis(100)) * 10;
        let sock = loop {
            match UdpSocket::bind(local) {
                Ok(sock) => break sock,
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(source) => return Err(HeartbeatError::Bind { local, source }),
            }
        };
        sock.set_read_timeout(Some(interval.max(Duration::from_millis(1)))).map_err(HeartbeatError::Socket)?;
        let shared = Arc::new(Shared {
            start: Instant::now(),
            last_heard_us: AtomicU64::new(0),
            heard_seq: AtomicU64::new(0),
            sent: Mutex::new(VecDeque::new()),
            gaps: ArrivalGaps::new(),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let beats = Beats::new(key, generation);
        std::thread::Builder::new()
            .name("ft-heartbeat".into())
            .spawn(move || beat(sock, peer, beats, timing, s))
            .map_err(HeartbeatError::Thread)?;
        Ok(Heartbeat { shared })
    }

    /// How long since the peer's last heartbeat (since start if never).
    pub fn silence(&self) -> Duration {
        let heard = self.shared.last_heard_us.load(Ordering::Relaxed);
        self.shared.start.elapsed().saturating_sub(Duration::from_micros(heard))
    }

    /// The heartbeat silence after which the peer is failed, learned from
    /// its beats' arrivals within `timing`'s bounds (see [`crate::adaptive`]).
    pub fn timeout(&self, timing: crate::Timing) -> Duration {
        self.shared.gaps.timeout(timing, Instant::now())
    }

    /// Whether the peer has been heard at all.
    pub fn heard(&self) -> bool {
        self.shared.last_heard_us.load(Ordering::Relaxed) != 0
    }

    /// A handle on what it has sent and heard.
    pub fn log(&self) -> HeartbeatLog {
        HeartbeatLog(self.shared.clone())
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

/// The beats of one pair's generation: made and checked (the datagram's
/// format is in the module's description).
pub struct Beats {
    key: [u8; 32],
    generation: u64,
}

impl Beats {
    /// The beats of `generation` under `key`.
    pub fn new(key: &PairKey, generation: u64) -> Beats {
        Beats { key: key.heartbeat_key(), generation }
    }

    /// The beat numbered `seq`.
    pub fn make(&self, seq: u64) -> [u8; BEAT_LEN] {
        let mut msg = [0u8; BEAT_LEN];
        msg[..4].copy_from_slice(MAGIC);
        msg[4..12].copy_from_slice(&self.generation.to_le_bytes());
        msg[12..20].copy_from_slice(&seq.to_le_bytes());
        let mac = blake3::keyed_hash(&self.key, &msg[..SIGNED]);
        msg[SIGNED..].copy_from_slice(mac.as_bytes());
        msg
    }

    /// The sequence number of `msg`, a datagram as received, if it is a
    /// valid beat of this generation; None for anything else.
    pub fn check(&self, msg: &[u8]) -> Option<u64> {
        if msg.len() != BEAT_LEN || &msg[..4] != MAGIC {
            return None;
        }
        // blake3::Hash compares in constant time.
        let mac = blake3::Hash::from_bytes(msg[SIGNED..].try_into().ok()?);
        if blake3::keyed_hash(&self.key, &msg[..SIGNED]) != mac {
            return None;
        }
        let generation = u64::from_le_bytes(msg[4..12].try_into().ok()?);
        (generation == self.generation).then(|| u64::from_le_bytes(msg[12..20].try_into().expect("8 bytes")))
    }
}

fn beat(sock: UdpSocket, mut peer: SocketAddr, beats: Beats, timing: LiveTiming, s: Arc<Shared>) {
    crate::priority::raise_watcher();
    let mut seq =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_micros() as u64);
    // The highest sequence number heard: a beat must pass it.
    let mut heard_seq = 0u64;
    let mut next = Instant::now();
    let mut buf = [0u8; 128];
    while !s.stop.load(Ordering::Relaxed) {
        if Instant::now() >= next {
            let interval = timing.get().interval;
            // A lost or refused beat is what the peer's detector is for.
            seq += 1;
            {
                let mut sent = s.sent.lock().unwrap_or_else(|e| e.into_inner());
                if sent.len() == SENT_KEPT {
                    sent.pop_front();
                }
                sent.push_back((seq, crate::fence::now_ns()));
            }
            let _ = sock.send_to(&beats.make(seq), peer);
            next += interval;
            if next < Instant::now() {
                next = Instant::now() + interval;
            }
        }
        let wait = next.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let _ = sock.set_read_timeout(Some(wait));
        if let Ok((n, from)) = sock.recv_from(&mut buf) {
            if from.ip() != peer.ip() {
                continue;
            }
            if let Some(seq) = beats.check(&buf[..n]).filter(|&seq| seq > heard_seq) {
                heard_seq = seq;
                // The peer beats from a port of its own (a primary may be
                // in two pairs at once while its backup moves): answered
                // there, once a beat proved it is the peer's.
                peer = from;
                let now = Instant::now();
                s.gaps.heard(now);
                let us = now.saturating_duration_since(s.start).as_micros().max(1) as u64;
                // The time first: whoever reads the sequence number may
                // rely on the silence it implies.
                s.last_heard_us.store(us, Ordering::Relaxed);
                s.heard_seq.store(seq, Ordering::Release);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> PairKey {
        PairKey::from_bytes([9; 32])
    }

    fn every(interval: Duration) -> crate::Timing {
        crate::Timing { timeout: interval * 10, min_timeout: interval * 10, interval }
    }

    /// What an attacker on the network can send, while the real peer is
    /// silent: forged beats (no key), a replay of the peer's own beats,
    /// and beats under another pair's key. None is heard.
    #[test]
    fn forged_replayed_or_foreign_beats_are_not_heard() {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let pa = UdpSocket::bind(any).unwrap().local_addr().unwrap();
        let attacker = UdpSocket::bind(any).unwrap();
        let a =
            Heartbeat::start(pa, attacker.local_addr().unwrap(), 5, every(Duration::from_millis(10)), &key()).unwrap();
        let mine = Beats { key: key().heartbeat_key(), generation: 5 };
        let theirs = Beats { key: PairKey::from_bytes([1; 32]).heartbeat_key(), generation: 5 };
        // The first valid beat is heard...
        attacker.send_to(&mine.make(100), pa).unwrap();
        let t0 = Instant::now();
        while !a.heard() {
            assert!(t0.elapsed() < Duration::from_secs(5), "a valid beat was never heard");
            std::thread::sleep(Duration::from_millis(5));
        }
        // ...then only invalid ones come: the silence must grow.
        let mut forged = mine.make(101);
        forged[SIGNED] ^= 1;
        let mut unsigned = [0u8; BEAT_LEN];
        unsigned[..4].copy_from_slice(MAGIC);
        unsigned[4..12].copy_from_slice(&5u64.to_le_bytes());
        unsigned[12..20].copy_from_slice(&102u64.to_le_bytes());
        let stop = Instant::now() + Duration::from_millis(300);
        while Instant::now() < stop {
            for m in
                [&mine.make(100)[..], &mine.make(99), &theirs.make(200), &forged, &unsigned, b"FTHB\x05\0\0\0\0\0\0\0"]
            {
                attacker.send_to(m, pa).unwrap();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(a.silence() >= Duration::from_millis(250), "heard something: {:?}", a.silence());
    }

    #[test]
    fn two_ends_hear_each_other_and_notice_silence() {
        let a_addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        // Fixed ports are needed so each knows the other; pick free ones.
        let pa = UdpSocket::bind(a_addr).unwrap().local_addr().unwrap();
        let pb = UdpSocket::bind(a_addr).unwrap().local_addr().unwrap();
        let iv = Duration::from_millis(10);
        let a = Heartbeat::start(pa, pb, 7, every(iv), &key()).unwrap();
        let b = Heartbeat::start(pb, pa, 7, every(iv), &key()).unwrap();
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

    /// A primary beats from a port of its own: the backup, which knew only
    /// the address, answers where the authenticated beats come from.
    #[test]
    fn a_peer_beating_from_its_own_port_is_answered_there() {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let pb = UdpSocket::bind(any).unwrap().local_addr().unwrap();
        // A port nobody listens on: what the backup is told at first.
        let nowhere = UdpSocket::bind(any).unwrap().local_addr().unwrap();
        let iv = Duration::from_millis(10);
        let a = Heartbeat::start(any, pb, 3, every(iv), &key()).unwrap();
        let b = Heartbeat::start(pb, nowhere, 3, every(iv), &key()).unwrap();
        let started = std::time::Instant::now();
        while !(a.heard() && b.heard()) {
            assert!(started.elapsed() < Duration::from_secs(5), "heard {} {}", a.heard(), b.heard());
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn an_address_in_use_is_an_error_that_names_it() {
        let taken = UdpSocket::bind("127.0.0.1:0").unwrap();
        let local = taken.local_addr().unwrap();
        let e = Heartbeat::start(local, local, 1, every(Duration::from_millis(10)), &key()).err().expect("bound twice");
        assert!(matches!(&e, HeartbeatError::Bind { local: l, .. } if *l == local), "{e:?}");
        assert!(e.to_string().starts_with(&format!("cannot bind the heartbeat address {local}: ")), "{e}");
    }

    #[test]
    fn another_generation_is_not_heard() {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let pa = UdpSocket::bind(any).unwrap().local_addr().unwrap();
        let pb = UdpSocket::bind(any).unwrap().local_addr().unwrap();
        let iv = Duration::from_millis(10);
        let a = Heartbeat::start(pa, pb, 1, every(iv), &key()).unwrap();
        let _b = Heartbeat::start(pb, pa, 2, every(iv), &key()).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(!a.heard());
    }
}
