//! The logging channel's protection: a Noise handshake keyed by the pair
//! key, then every byte either way sealed in authenticated, encrypted
//! frames. A peer without the key cannot complete the handshake, read
//! what is sent, or insert, change, replay or reorder a single byte: each
//! frame's nonce is its position in the stream, so a frame out of place
//! fails to open, and the channel is declared failed.
//!
//! The pattern is `Noise_NNpsk0_25519_AESGCM_SHA256`: both sides prove
//! they hold the pre-shared key (derived from the pair key) in the first
//! round trip, and ephemeral Diffie-Hellman gives each connection fresh
//! keys, so a key stolen later opens no recorded session.
//!
//! Freshness: NNpsk0's first message proves the key but not that it was
//! made now. A recorded one sent again opens on the backup like the
//! original did, and before issue 68 the backup then took the connection
//! for its primary, found no log on it, declared the primary failed and
//! ended. So the handshake has a third message: the primary's first
//! frame under the session's keys, a fixed confirmation ([`CONFIRM`]).
//! Those keys come from the backup's fresh ephemeral key as much as from
//! the primary's, so only the peer that made the first message (holding
//! its ephemeral secret) and read the backup's reply to it can seal the
//! confirmation: a replay gets a reply it cannot use, and the backup
//! commits to nothing (no session, no primary, no event but a refused
//! stranger) until the confirmation opens. Noise through
//! `snow` rather than mutual TLS through rustls because the two hosts of a
//! pair share one secret on the storage they already trust; certificates
//! would add an authority and their files for nothing the pair needs, and
//! the whole handshake is two messages. AES-GCM because the hosts have AES
//! instructions: the checkpoint stream carries hundreds of MB/s.
//!
//! A frame on the wire: its length (u16, big-endian, as Noise suggests)
//! and a Noise transport message (at most 65535 bytes, its 16-byte tag
//! included). Each direction has its own key and nonce; the sending and
//! the receiving halves ([`Sealer`], [`Opener`]) are used by different
//! threads, so the transport is Noise's stateless form, with the nonces
//! counted here.

use crate::pair_key::PairKey;
use snow::StatelessTransportState;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

const PATTERN: &str = "Noise_NNpsk0_25519_AESGCM_SHA256";
/// Binds the handshake to this protocol and version: a session of any
/// other use of the same key cannot be passed off as one of ours, and
/// two builds whose messages differ do not talk (v2: acknowledgements
/// carry the backup's timeout; v4: the primary confirms the session).
const PROLOGUE: &[u8] = b"ftvm logging channel v4";
/// The handshake's third message, sealed as the primary's first frame
/// (nonce 0) under the session's keys: what proves to the backup that
/// the primary took part in this handshake, not an earlier one.
const CONFIRM: &[u8] = b"ftvm primary confirms a fresh session";
/// Noise's largest message.
const MAX_MESSAGE: usize = 65535;
const TAG: usize = 16;
/// The most plaintext one frame carries.
const MAX_PLAIN: usize = MAX_MESSAGE - TAG;

/// Why a handshake did not give a session.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The other end does not hold this pair's key (or is not ftvm).
    #[error("the peer does not hold this pair's key (is it the same pair, with the same --shared or --pair-key?)")]
    WrongKey,
    #[error("the peer sent no handshake within {} s", .0.as_secs())]
    TimedOut(Duration),
    #[error("the peer sent a malformed handshake")]
    Malformed,
    /// The first message opened (it was made under the pair's key) but the
    /// peer did not confirm the session our reply made: a recorded
    /// handshake sent again, or a primary that left half-way.
    #[error("the peer did not confirm a fresh session (a recorded handshake replayed?)")]
    Unconfirmed,
    #[error("the handshake broke off: {0}")]
    Io(#[source] std::io::Error),
    /// Too many connections were completing their handshakes at once
    /// (from this peer's address, or in all with none of them idle).
    #[error("too many handshakes in progress")]
    Busy,
    /// Connected and said nothing, and its slot was taken for a newer
    /// connection (a waiting backup closes the oldest silent one when all
    /// its handshake slots are held).
    #[error("closed while silent to make room for another handshake")]
    Evicted,
}

fn io(e: std::io::Error) -> HandshakeError {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => HandshakeError::TimedOut(Duration::ZERO),
        _ => HandshakeError::Io(e),
    }
}

/// A connection's keys once the handshake is done, and the nonce each
/// direction goes on from (the confirmation took the primary's first).
pub struct Session {
    t: Arc<StatelessTransportState>,
    send: u64,
    receive: u64,
}

impl Session {
    /// The sending and the receiving half.
    pub fn split(self) -> (Sealer, Opener) {
        (Sealer { t: self.t.clone(), nonce: self.send }, Opener { t: self.t, nonce: self.receive, pending: Vec::new() })
    }
}

fn params() -> snow::params::NoiseParams {
    PATTERN.parse().expect("a valid Noise pattern")
}

/// The primary's side of the handshake on a connected `stream`, within `wait`.
pub fn initiate(stream: &mut TcpStream, key: &PairKey, wait: Duration) -> Result<Session, HandshakeError> {
    let deadline = Instant::now() + wait;
    let (hs, first) = Initiator::start(key);
    send(stream, &first, deadline, wait)?;
    // A responder that cannot open our first message closes the
    // connection without a word: to us, that is a key it does not hold.
    let reply = receive(stream, deadline, wait).map_err(|e| match e {
        HandshakeError::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => HandshakeError::WrongKey,
        e => e,
    })?;
    let (session, confirm) = hs.finish(&reply)?;
    send(stream, &confirm, deadline, wait)?;
    clear_timeouts(stream)?;
    Ok(session)
}

/// The backup's side of the handshake on an accepted `stream`, within `wait`.
pub fn respond(stream: &mut TcpStream, key: &PairKey, wait: Duration) -> Result<Session, HandshakeError> {
    let deadline = Instant::now() + wait;
    let first = receive(stream, deadline, wait)?;
    let (reply, answered) = answer(key, &first)?;
    send(stream, &reply, deadline, wait)?;
    // Until the confirmation opens, whoever sent `first` may only have
    // recorded it: a peer that goes away now is a stranger, not a
    // primary that failed.
    let confirm = receive(stream, deadline, wait).map_err(|e| match e {
        HandshakeError::Io(_) | HandshakeError::Malformed => HandshakeError::Unconfirmed,
        e => e,
    })?;
    let session = answered.confirm(&confirm)?;
    clear_timeouts(stream)?;
    Ok(session)
}

/// The primary's side of a handshake, apart from any socket: the first
/// message to send, then the backup's reply to finish with.
pub struct Initiator(snow::HandshakeState);

impl Initiator {
    /// A handshake under `key`, and its first message.
    pub fn start(key: &PairKey) -> (Initiator, Vec<u8>) {
        let psk = key.channel_psk();
        let mut hs = snow::Builder::new(params())
            .prologue(PROLOGUE)
            .and_then(|b| b.psk(0, &psk))
            .and_then(|b| b.build_initiator())
            .expect("a valid Noise configuration");
        let mut msg = vec![0u8; MAX_MESSAGE];
        let n = hs.write_message(&[], &mut msg).expect("a first handshake message");
        msg.truncate(n);
        (Initiator(hs), msg)
    }

    /// The session, from the backup's `reply` (whatever arrived: a reply
    /// that is not one under this key is refused), and the confirmation
    /// to send the backup, the handshake's third message.
    pub fn finish(mut self, reply: &[u8]) -> Result<(Session, Vec<u8>), HandshakeError> {
        let mut msg = vec![0u8; MAX_MESSAGE];
        self.0.read_message(reply, &mut msg).map_err(|_| HandshakeError::WrongKey)?;
        let t = transport(self.0)?;
        let mut confirm = vec![0u8; CONFIRM.len() + TAG];
        let n = t.write_message(0, CONFIRM, &mut confirm).expect("a confirmation fits its buffer");
        confirm.truncate(n);
        Ok((Session { t, send: 1, receive: 0 }, confirm))
    }
}

/// The backup's side of a handshake that answered a first message that
/// opened: a session only once the primary confirms it ([`Answered::confirm`]).
pub struct Answered(Arc<StatelessTransportState>);

impl Answered {
    /// The session, if `confirm` (whatever arrived as the third message)
    /// is the confirmation sealed under this handshake's keys.
    pub fn confirm(self, confirm: &[u8]) -> Result<Session, HandshakeError> {
        let mut plain = vec![0u8; confirm.len()];
        match self.0.read_message(0, confirm, &mut plain) {
            Ok(n) if &plain[..n] == CONFIRM => Ok(Session { t: self.0, send: 0, receive: 1 }),
            _ => Err(HandshakeError::Unconfirmed),
        }
    }
}

/// The backup's side of a handshake, apart from any socket: the reply to
/// the primary's `first` message (whatever arrived), and what takes the
/// primary's confirmation. Answering commits the backup to nothing: a
/// recorded first message opens as well as a fresh one.
pub fn answer(key: &PairKey, first: &[u8]) -> Result<(Vec<u8>, Answered), HandshakeError> {
    let psk = key.channel_psk();
    let mut hs = snow::Builder::new(params())
        .prologue(PROLOGUE)
        .and_then(|b| b.psk(0, &psk))
        .and_then(|b| b.build_responder())
        .expect("a valid Noise configuration");
    let mut msg = vec![0u8; MAX_MESSAGE];
    // The first message's payload is sealed with the pre-shared key: a
    // peer without it fails here, before we answer anything.
    hs.read_message(first, &mut msg).map_err(|_| HandshakeError::WrongKey)?;
    let n = hs.write_message(&[], &mut msg).expect("a second handshake message");
    msg.truncate(n);
    Ok((msg, Answered(transport(hs)?)))
}

fn transport(hs: snow::HandshakeState) -> Result<Arc<StatelessTransportState>, HandshakeError> {
    let t = hs.into_stateless_transport_mode().map_err(|_| HandshakeError::Malformed)?;
    Ok(Arc::new(t))
}

fn clear_timeouts(stream: &TcpStream) -> Result<(), HandshakeError> {
    stream.set_read_timeout(None).map_err(HandshakeError::Io)?;
    stream.set_write_timeout(None).map_err(HandshakeError::Io)
}

fn time_left(stream: &TcpStream, deadline: Instant, wait: Duration) -> Result<(), HandshakeError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(HandshakeError::TimedOut(wait));
    }
    stream.set_read_timeout(Some(left)).map_err(HandshakeError::Io)?;
    stream.set_write_timeout(Some(left)).map_err(HandshakeError::Io)
}

fn send(stream: &mut TcpStream, msg: &[u8], deadline: Instant, wait: Duration) -> Result<(), HandshakeError> {
    time_left(stream, deadline, wait)?;
    let mut framed = (msg.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(msg);
    stream.write_all(&framed).map_err(|e| timed(io(e), wait))
}

fn receive(stream: &mut TcpStream, deadline: Instant, wait: Duration) -> Result<Vec<u8>, HandshakeError> {
    time_left(stream, deadline, wait)?;
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).map_err(|e| timed(io(e), wait))?;
    let len = u16::from_be_bytes(len) as usize;
    if len < TAG {
        return Err(HandshakeError::Malformed);
    }
    let mut msg = vec![0u8; len];
    time_left(stream, deadline, wait)?;
    stream.read_exact(&mut msg).map_err(|e| timed(io(e), wait))?;
    Ok(msg)
}

fn timed(e: HandshakeError, wait: Duration) -> HandshakeError {
    match e {
        HandshakeError::TimedOut(_) => HandshakeError::TimedOut(wait),
        e => e,
    }
}

/// Seals what one side sends, frame by frame.
pub struct Sealer {
    t: Arc<StatelessTransportState>,
    nonce: u64,
}

impl Sealer {
    /// Appends a frame that carries nothing, sealed, to `out`: it shows
    /// the peer this side is alive, and only the pair's key can make it.
    pub(super) fn seal_nothing(&mut self, out: &mut Vec<u8>) {
        let start = out.len();
        out.resize(start + 2 + TAG, 0);
        let n = self.t.write_message(self.nonce, &[], &mut out[start + 2..]).expect("a frame fits its buffer");
        self.nonce += 1;
        out[start..start + 2].copy_from_slice(&(n as u16).to_be_bytes());
        out.truncate(start + 2 + n);
    }

    /// Appends `plain`, sealed, to `out`.
    pub fn seal(&mut self, plain: &[u8], out: &mut Vec<u8>) {
        for piece in plain.chunks(MAX_PLAIN) {
            let start = out.len();
            out.resize(start + 2 + piece.len() + TAG, 0);
            let n = self.t.write_message(self.nonce, piece, &mut out[start + 2..]).expect("a frame fits its buffer");
            self.nonce += 1;
            out[start..start + 2].copy_from_slice(&(n as u16).to_be_bytes());
            out.truncate(start + 2 + n);
        }
    }
}

/// Opens what the other side sent, as its bytes come.
pub struct Opener {
    t: Arc<StatelessTransportState>,
    nonce: u64,
    /// Bytes of a frame that has not all come.
    pending: Vec<u8>,
}

/// A frame that does not open: not sealed by the peer's key at this
/// place in the stream (forged, changed, replayed or reordered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unauthentic;

impl Opener {
    /// Bytes of a frame begun but not whole: what the next `open` may
    /// give out beyond the raw bytes it is handed.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Takes `raw` bytes from the wire and appends the plaintext of every
    /// frame now whole to `out`.
    pub fn open(&mut self, raw: &[u8], out: &mut Vec<u8>) -> Result<(), Unauthentic> {
        self.pending.extend_from_slice(raw);
        let mut at = 0;
        while self.pending.len() - at >= 2 {
            let len = u16::from_be_bytes([self.pending[at], self.pending[at + 1]]) as usize;
            if len < TAG {
                return Err(Unauthentic);
            }
            if self.pending.len() - at - 2 < len {
                break;
            }
            let frame = &self.pending[at + 2..at + 2 + len];
            let start = out.len();
            out.resize(start + len, 0);
            match self.t.read_message(self.nonce, frame, &mut out[start..]) {
                Ok(n) => out.truncate(start + n),
                Err(_) => {
                    out.truncate(start);
                    return Err(Unauthentic);
                }
            }
            self.nonce += 1;
            at += 2 + len;
        }
        self.pending.drain(..at);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair(a: &PairKey, b: &PairKey) -> (Result<Session, HandshakeError>, Result<Session, HandshakeError>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let b = b.clone();
        let backup = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            respond(&mut s, &b, Duration::from_secs(5))
        });
        let mut s = TcpStream::connect(addr).unwrap();
        let primary = initiate(&mut s, a, Duration::from_secs(5));
        (primary, backup.join().unwrap())
    }

    #[test]
    fn same_key_seals_and_opens_both_ways() {
        let k = PairKey::from_bytes([1; 32]);
        let (p, b) = pair(&k, &k);
        let (mut p_seal, mut p_open) = p.unwrap().split();
        let (mut b_seal, mut b_open) = b.unwrap().split();
        let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let mut wire = Vec::new();
        p_seal.seal(&big, &mut wire);
        p_seal.seal(b"more", &mut wire);
        let mut got = Vec::new();
        // Arriving in odd pieces.
        for piece in wire.chunks(777) {
            b_open.open(piece, &mut got).unwrap();
        }
        assert_eq!(got.len(), big.len() + 4);
        assert!(got.starts_with(&big) && got.ends_with(b"more"));
        let mut back = Vec::new();
        b_seal.seal(b"ack", &mut back);
        let mut acked = Vec::new();
        p_open.open(&back, &mut acked).unwrap();
        assert_eq!(acked, b"ack");
    }

    #[test]
    fn another_key_fails_the_handshake_on_both_sides() {
        let (p, b) = pair(&PairKey::from_bytes([1; 32]), &PairKey::from_bytes([2; 32]));
        assert!(matches!(b, Err(HandshakeError::WrongKey)), "{:?}", b.err());
        assert!(p.is_err());
    }

    #[test]
    fn changed_replayed_or_reordered_frames_do_not_open() {
        let k = PairKey::from_bytes([3; 32]);
        let (p, b) = pair(&k, &k);
        let (mut seal, _) = p.unwrap().split();
        let (_, open) = b.unwrap().split();
        let (mut one, mut two) = (Vec::new(), Vec::new());
        seal.seal(b"first", &mut one);
        seal.seal(b"second", &mut two);
        let fresh = || Opener { t: open.t.clone(), nonce: open.nonce, pending: Vec::new() };
        let mut out = Vec::new();
        // Reordered: the second frame first.
        assert_eq!(fresh().open(&two, &mut out), Err(Unauthentic));
        // Replayed: the first frame twice.
        let mut o = fresh();
        o.open(&one, &mut out).unwrap();
        assert_eq!(o.open(&one, &mut out), Err(Unauthentic));
        // Changed: one bit.
        let mut changed = one.clone();
        *changed.last_mut().unwrap() ^= 1;
        assert_eq!(fresh().open(&changed, &mut out), Err(Unauthentic));
    }

    /// Issue 68: a first message recorded from a real handshake and sent
    /// again is answered (it opens under the key) but gives no session:
    /// the confirmation that would finish it takes the ephemeral secret of
    /// the primary that made it, and the backup's new reply.
    #[test]
    fn a_replayed_first_message_gives_no_session() {
        let k = PairKey::from_bytes([5; 32]);
        let (primary, first) = Initiator::start(&k);
        let (reply, answered) = answer(&k, &first).unwrap();
        let (_, confirm) = primary.finish(&reply).unwrap();
        assert!(answered.confirm(&confirm).is_ok(), "the real handshake");
        // The replay: answered again, with a reply of fresh keys...
        let (reply2, replayed) = answer(&k, &first).unwrap();
        assert_ne!(reply, reply2, "the backup's reply is fresh each time");
        // ...which the recorded confirmation does not open, nor garbage.
        assert!(matches!(replayed.confirm(&confirm), Err(HandshakeError::Unconfirmed)));
        let (_, replayed) = answer(&k, &first).unwrap();
        assert!(matches!(replayed.confirm(&[0u8; 53]), Err(HandshakeError::Unconfirmed)));
    }

    /// The same over a socket: a replayer that sends a recorded first
    /// message, reads the answer and goes (or stays silent) gets no
    /// session from `respond`.
    #[test]
    fn respond_gives_a_replayer_no_session() {
        let k = PairKey::from_bytes([6; 32]);
        let (_, first) = Initiator::start(&k);
        let mut framed = (first.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&first);
        for stay in [false, true] {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let mut replayer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            replayer.write_all(&framed).unwrap();
            if !stay {
                replayer.shutdown(std::net::Shutdown::Write).unwrap();
            }
            let (mut s, _) = listener.accept().unwrap();
            let r = respond(&mut s, &k, Duration::from_millis(500));
            match (stay, r) {
                (false, Err(HandshakeError::Unconfirmed)) | (true, Err(HandshakeError::TimedOut(_))) => {}
                (_, r) => panic!("a replay gave {:?}", r.map(|_| "a session")),
            }
        }
    }

    #[test]
    fn a_silent_peer_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let _idle = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut s, _) = listener.accept().unwrap();
        let t0 = Instant::now();
        let r = respond(&mut s, &PairKey::from_bytes([4; 32]), Duration::from_millis(300));
        assert!(matches!(r, Err(HandshakeError::TimedOut(_))), "{:?}", r.err());
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
}
