//! The backup's end of the logging channel ([`LogReceiver`]): the log
//! read into a bounded pipe and acknowledged on receipt (VMware FT §3.2),
//! the replaying VM's view of it ([`LogPipe`]), and the failure detector
//! for the primary.

use super::failure::{declare, detect, Failure};
use super::pipe::Pipe;
use super::secure::{self, HandshakeError, Opener, Sealer, Session};
use super::sender::HANDSHAKE_WAIT;
use super::wire::{self, MAX_REQUEST};
use super::{spawn, spawn_mover, spawn_watcher, ChannelError, Clock, RequestTooLarge, SPIN_FOR, WAITER_GRACE};
use crate::adaptive::Promises;
use crate::heartbeat::Heartbeat;
use crate::pair_key::PairKey;
use crate::poll::{self, WaiterTurn};
use crate::{LiveTiming, Timing};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

struct BackupShared {
    clock: Clock,
    pipe: Pipe,
    received: AtomicU64,
    /// Set by the replaying VM: how far it has executed.
    executed: AtomicU64,
    last_heard_us: AtomicU64,
    heartbeat: Mutex<Option<Heartbeat>>,
    failed: Mutex<Option<Failure>>,
    /// Failure declared, but the log stays open until the caller decides
    /// (the arbiter) whether to go live or halt.
    stop: AtomicBool,
    /// Milliseconds each acknowledgement is held back (a test aid: it
    /// makes the Output Rule visible on the primary's wire).
    ack_delay_ms: AtomicU64,
    /// Until the backup is ready to follow, acknowledgements say it is
    /// alive but acknowledge no log.
    ready: AtomicBool,
    /// A refusal to send instead of acknowledgements, and then stop.
    refusal: Mutex<Option<String>>,
    refused: AtomicBool,
    /// Requests to send the primary ahead of any acknowledgement of log.
    requests: Mutex<Vec<Vec<u8>>>,
    /// The socket's reading and acknowledging state, taken by the
    /// receiving thread or by the replaying VM's thread waiting for log,
    /// whoever holds it. Set by [`LogReceiver::start`].
    receipt: Mutex<Option<Receipt>>,
    /// Whether the replaying VM's thread, waiting for log, reads the
    /// socket itself (with [`LogReceiver::short_waits`], for
    /// [`WAITER_GRACE`] after its wait too), the receiving thread keeping
    /// off: sharing the VM's core, it would have to be switched to for
    /// every frame, and back, which under the original epoch protocol is
    /// on the path of every epoch end.
    log_turn: WaiterTurn,
    /// Whether the VM's thread keeps the socket for [`WAITER_GRACE`]
    /// after a wait (see [`LogReceiver::short_waits`]).
    short_waits: AtomicBool,
    /// The failure detection settings, given at [`LogReceiver::start`]
    /// and changed by the primary's control entries.
    timing: LiveTiming,
    /// The heartbeat timeouts told the primary, which bind the detector.
    promises: Promises,
    /// The socket, to look at without taking the [`Receipt`] (set by
    /// [`LogReceiver::start`]).
    socket: std::sync::OnceLock<TcpStream>,
}

impl BackupShared {
    /// The heartbeat silence the detector judges by under `timing`: the
    /// timeout learned from `hb`, or a longer one told the primary that
    /// may still bound its lease.
    fn beat_timeout(&self, hb: &Heartbeat, timing: Timing) -> Duration {
        hb.timeout(timing).max(self.promises.binding())
    }
}

/// The backup's end: receives the log, acknowledges it, detects failure.
pub struct LogReceiver {
    shared: Arc<BackupShared>,
    peer: SocketAddr,
    stream: TcpStream,
    /// The connection's keys, until [`LogReceiver::start`] takes them.
    session: Mutex<Option<Session>>,
}

/// Handshakes a waiting backup runs at once. Each lasts [`HANDSHAKE_WAIT`]
/// at most and holds three small messages and a thread, so a flood costs
/// bounded time and memory. Issue 68: 16 idle strangers used to hold all
/// the slots (then 16) and the real primary was turned away, so slots are
/// also bounded per source address ([`MAX_PER_SOURCE`]), a connection
/// that says nothing for [`FIRST_BYTE_WAIT`] is closed, and when all are
/// held a new connection takes the slot of the oldest that has said
/// nothing: a primary, which speaks as soon as it connects, is never
/// the one closed while a silent one holds a slot.
const MAX_HANDSHAKES: usize = 64;
/// Handshakes at once from one IP address: a primary makes one at a time,
/// so strangers from one address hold at most this many slots.
const MAX_PER_SOURCE: usize = 4;
/// How long a connection may stay silent before its first byte: a
/// primary sends its first message as soon as it is connected (it is
/// made before the connection). Generous for a loaded host, short beside
/// [`HANDSHAKE_WAIT`].
pub(super) const FIRST_BYTE_WAIT: Duration = Duration::from_secs(3);

impl LogReceiver {
    /// Waits for the pair's primary: the first connection on `listener`
    /// whose handshake proves it holds `key`. Every other connection
    /// (garbage, another key, one that says nothing) is closed and told
    /// to `refused`; the backup goes on listening.
    pub fn accept(
        listener: &TcpListener,
        buffer: usize,
        key: &PairKey,
        refused: impl Fn(SocketAddr, HandshakeError) + Send + Sync + 'static,
    ) -> Result<LogReceiver, ChannelError> {
        let (stream, peer, session) = first_handshake(listener, key, Arc::new(refused))?;
        stream.set_nodelay(true).map_err(ChannelError::Socket)?;
        let shared = Arc::new(BackupShared {
            clock: Clock(Instant::now()),
            pipe: Pipe::new(buffer),
            received: AtomicU64::new(0),
            executed: AtomicU64::new(0),
            last_heard_us: AtomicU64::new(0),
            heartbeat: Mutex::new(None),
            failed: Mutex::new(None),
            stop: AtomicBool::new(false),
            ack_delay_ms: AtomicU64::new(0),
            ready: AtomicBool::new(true),
            refusal: Mutex::new(None),
            refused: AtomicBool::new(false),
            requests: Mutex::new(Vec::new()),
            receipt: Mutex::new(None),
            log_turn: WaiterTurn::default(),
            short_waits: AtomicBool::new(false),
            timing: LiveTiming::new(Timing::DEFAULT),
            promises: Promises::default(),
            socket: std::sync::OnceLock::new(),
        });
        Ok(LogReceiver { shared, peer, stream, session: Mutex::new(Some(session)) })
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Starts receiving: acknowledgements every read and every
    /// `timing.interval` (settings that [`LogReceiver::follow_timeout`]
    /// changes later); `on_failure` hears once when the primary is
    /// declared failed. The log stays readable through [`LogPipe`] to its
    /// last byte received until [`LogReceiver::end_log`].
    pub fn start(
        &self,
        timing: Timing,
        on_failure: impl Fn(Failure) + Send + Sync + 'static,
    ) -> Result<(), ChannelError> {
        self.shared.timing.set(timing);
        let on_failure = Arc::new(on_failure);
        let fail = {
            let (shared, on_failure) = (self.shared.clone(), on_failure.clone());
            Arc::new(move |f: Failure| {
                if declare(&shared.failed, &f) {
                    on_failure(f);
                }
            })
        };
        let clone = || self.stream.try_clone().map_err(ChannelError::Socket);
        let readable = clone()?;
        let _ = self.shared.socket.set(clone()?);
        let (sealer, opener) = self.session.lock().unwrap().take().expect("a receiver starts once").split();
        *self.shared.receipt.lock().unwrap() = Some(Receipt {
            input: clone()?,
            opener,
            plain: Vec::new(),
            out: clone()?,
            sealer,
            frames: Vec::new(),
            buf: vec![0u8; 1 << 16],
            last_ack: Instant::now(),
            acked: (u64::MAX, u64::MAX),
            delayed: VecDeque::new(),
            released: 0,
            end: None,
        });
        {
            let (shared, fail) = (self.shared.clone(), fail.clone());
            let thread = spawn_mover("ft-log-receive", move || receive(&shared, &readable, &*fail))?;
            self.shared.log_turn.set_thread(thread.thread().clone());
        }
        {
            let shared = self.shared.clone();
            let waiting = clone()?;
            spawn_watcher("ft-detect", move || {
                // Bytes the primary sent wait in our socket unread: the
                // silence is ours (the replay behind, the pipe full, a
                // thread of ours kept off the CPU), not the primary's,
                // whose writes may be blocked on our full window (issue
                // 65). Its beats still judge it meanwhile.
                let silence = || {
                    if poll::unread(&waiting) > 0 {
                        shared.last_heard_us.store(shared.clock.now_us(), Ordering::Relaxed);
                    }
                    shared.clock.since(shared.last_heard_us.load(Ordering::Relaxed))
                };
                let timing = || shared.timing.get();
                let beat_timeout = |hb: &Heartbeat, t| shared.beat_timeout(hb, t);
                detect(timing, &shared.heartbeat, beat_timeout, &shared.stop, &shared.failed, silence, |f| fail(f))
            })?;
        }
        Ok(())
    }

    /// Watches the primary's heartbeats too, from now on (they can start
    /// only once the log's header named the pair's generation).
    pub fn add_heartbeat(&self, heartbeat: Heartbeat) {
        *self.shared.heartbeat.lock().unwrap() = Some(heartbeat);
    }

    /// The failure detection settings, for the heartbeats to pace by.
    pub fn timing(&self) -> LiveTiming {
        self.shared.timing.clone()
    }

    /// Takes the failure timeout the primary sent in a control entry
    /// (see [`LiveTiming::follow`] for when a shorter one holds).
    pub fn follow_timeout(&self, timeout: Duration) {
        self.shared.timing.follow(timeout);
    }

    /// The heartbeat silence after which the primary is declared failed
    /// now: learned from its beats, or a longer one this side told it
    /// (the timeout while no beat is watched).
    pub fn heartbeat_timeout(&self) -> Duration {
        let timing = self.shared.timing.get();
        match &*self.shared.heartbeat.lock().unwrap() {
            Some(hb) => self.shared.beat_timeout(hb, timing),
            None => timing.timeout,
        }
    }

    /// Stops the heartbeats (a backup going live): its socket is let go,
    /// for the pair this side may start as a primary later.
    pub fn stop_heartbeat(&self) {
        self.shared.heartbeat.lock().unwrap().take();
    }

    /// Acknowledges each byte only `delay` after its receipt: a slow
    /// network on the way back, for tests of the Output Rule. The
    /// periodic acknowledgements go on meanwhile, so the primary does not
    /// take the delay for a failure.
    pub fn delay_acks(&self, delay: Duration) {
        self.shared.ack_delay_ms.store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    /// Acknowledges no log until [`LogReceiver::ready`]: a primary that
    /// waits for its first acknowledgement waits for the backup's checks
    /// (call before [`LogReceiver::start`]).
    pub fn hold_acks(&self) {
        self.shared.ready.store(false, Ordering::Relaxed);
    }

    /// The replaying VM comes back for more log within microseconds of
    /// taking some (at the next epoch end), so after a wait its thread
    /// keeps reading the socket itself for [`WAITER_GRACE`], and the
    /// receiving thread keeps off meanwhile, rather than be woken to
    /// take the socket back for each frame. Not for a VM that replays
    /// long stretches between its waits: a frame that came meanwhile
    /// would wait for its acknowledgement until the VM waits again.
    pub fn short_waits(&self) {
        self.shared.short_waits.store(true, Ordering::Relaxed);
    }

    /// Acknowledges the log from now on.
    pub fn ready(&self) {
        // Release: a request made before this goes out before the first
        // acknowledgement of log (see `receive`).
        self.shared.ready.store(true, Ordering::Release);
    }

    /// Sends the primary `request` (at most [`MAX_REQUEST`] bytes) before
    /// this backup is [`ready`](LogReceiver::ready): it arrives ahead of
    /// the first acknowledgement of log.
    pub fn request(&self, request: Vec<u8>) -> Result<(), RequestTooLarge> {
        if request.len() > MAX_REQUEST {
            return Err(RequestTooLarge { len: request.len() });
        }
        self.shared.requests.lock().unwrap().push(request);
        Ok(())
    }

    /// Tells the primary this backup will not follow it, and why, then
    /// closes the channel (waiting up to a second for the words to go).
    pub fn refuse(&self, why: &str) {
        // Not ready: the VM's thread leaves the socket to the receiving
        // thread, which sends the refusal.
        self.shared.ready.store(false, Ordering::Release);
        *self.shared.refusal.lock().unwrap() = Some(why.to_string());
        let t0 = Instant::now();
        while !self.shared.refused.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.end_log();
    }

    /// The replaying VM's view of the log.
    pub fn pipe(&self) -> LogPipe {
        LogPipe { shared: self.shared.clone() }
    }

    /// The replaying VM reached `icount`.
    pub fn set_executed(&self, icount: u64) {
        // Release/Acquire: what the replay published before it (its last
        // go-live point) is seen by whoever reads this.
        self.shared.executed.store(icount, Ordering::Release);
    }

    /// How far the replaying VM has executed, as last set.
    pub fn executed(&self) -> u64 {
        self.shared.executed.load(Ordering::Acquire)
    }

    pub fn received(&self) -> u64 {
        self.shared.received.load(Ordering::Relaxed)
    }

    /// Bytes received and not yet consumed by the VM.
    pub fn buffered(&self) -> usize {
        self.shared.pipe.len()
    }

    pub fn failure(&self) -> Option<Failure> {
        self.shared.failed.lock().unwrap().clone()
    }

    /// Waits until the replaying VM has taken every byte received and
    /// waits for more (true), or has stopped reading the log
    /// ([`LogReceiver::reading_done`], false). A primary that powers its
    /// VM off closes the channel too, once its end is acknowledged: only
    /// the log read to its last byte tells that close from a failure.
    pub fn wait_consumed(&self) -> bool {
        self.shared.pipe.wait_consumed()
    }

    /// The replaying VM reads no more of the log: it reached its end, or
    /// cannot follow it.
    pub fn reading_done(&self) {
        self.shared.pipe.reader_done();
    }

    /// No more log will be taken: the VM drains what was received, then
    /// sees the log end (its last go-live point is where it goes live).
    pub fn end_log(&self) {
        self.stop_receiving();
        self.shared.pipe.close();
    }

    /// Takes no more log (the primary is declared failed): what was
    /// received stays readable, and the primary, if it still runs, sees
    /// the channel close.
    pub fn stop_receiving(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

impl Drop for LogReceiver {
    fn drop(&mut self) {
        self.end_log();
    }
}

/// A handshake in progress on a waiting backup.
struct Slot {
    id: u64,
    peer: SocketAddr,
    /// The connection, to close it from the accepting thread.
    stream: TcpStream,
    /// Whether anything came on it yet.
    spoke: Arc<AtomicBool>,
    /// Closed to make room (the handshake's thread then says so).
    evicted: Arc<AtomicBool>,
}

/// The handshakes in progress, oldest first.
#[derive(Default)]
struct Slots {
    list: Mutex<Vec<Slot>>,
}

impl Slots {
    /// A slot for a connection from `peer`, or why not: a newer
    /// connection takes the slot of the oldest silent one, from the same
    /// address if that address has all its own, else from any if all are
    /// held; with none silent, it is refused.
    fn take(
        &self,
        id: u64,
        peer: SocketAddr,
        stream: &TcpStream,
    ) -> Result<(Arc<AtomicBool>, Arc<AtomicBool>), HandshakeError> {
        let mut list = self.list.lock().unwrap();
        let same = |s: &Slot| s.peer.ip() == peer.ip();
        let evict_from = if list.iter().filter(|s| same(s)).count() >= MAX_PER_SOURCE {
            Some(true)
        } else if list.len() >= MAX_HANDSHAKES {
            Some(false)
        } else {
            None
        };
        if let Some(same_only) = evict_from {
            let idle = list.iter().position(|s| !s.spoke.load(Ordering::Acquire) && (!same_only || same(s)));
            let Some(i) = idle else { return Err(HandshakeError::Busy) };
            let slot = list.remove(i);
            slot.evicted.store(true, Ordering::Release);
            let _ = slot.stream.shutdown(Shutdown::Both);
        }
        // A primary's first message is usually here by now: then it is
        // never the silent one closed for a newer connection.
        let spoke = Arc::new(AtomicBool::new(poll::readable_within(stream, Duration::ZERO).unwrap_or(false)));
        let evicted = Arc::new(AtomicBool::new(false));
        let clone = stream.try_clone().map_err(HandshakeError::Io)?;
        list.push(Slot { id, peer, stream: clone, spoke: spoke.clone(), evicted: evicted.clone() });
        Ok((spoke, evicted))
    }

    fn free(&self, id: u64) {
        self.list.lock().unwrap().retain(|s| s.id != id);
    }
}

/// The backup's side of one connection's handshake, in its slot: a first
/// byte within [`FIRST_BYTE_WAIT`], then the handshake within
/// [`HANDSHAKE_WAIT`].
fn handshake_in_slot(
    stream: &mut TcpStream,
    key: &PairKey,
    spoke: &AtomicBool,
    evicted: &AtomicBool,
) -> Result<Session, HandshakeError> {
    stream.set_nonblocking(false).map_err(HandshakeError::Io)?;
    if !poll::readable_within(stream, FIRST_BYTE_WAIT).map_err(HandshakeError::Io)? {
        return Err(if evicted.load(Ordering::Acquire) {
            HandshakeError::Evicted
        } else {
            HandshakeError::TimedOut(FIRST_BYTE_WAIT)
        });
    }
    spoke.store(true, Ordering::Release);
    secure::respond(stream, key, HANDSHAKE_WAIT).map_err(|e| {
        if evicted.load(Ordering::Acquire) {
            HandshakeError::Evicted
        } else {
            e
        }
    })
}

/// Accepts connections until one completes the handshake; each runs its
/// handshake on a thread of its own, in a slot ([`Slots`]), so none holds
/// up the others.
fn first_handshake(
    listener: &TcpListener,
    key: &PairKey,
    refused: Arc<dyn Fn(SocketAddr, HandshakeError) + Send + Sync>,
) -> Result<(TcpStream, SocketAddr, Session), ChannelError> {
    listener.set_nonblocking(true).map_err(ChannelError::Socket)?;
    let (done_tx, done) = mpsc::channel::<(TcpStream, SocketAddr, Session)>();
    let slots = Arc::new(Slots::default());
    let mut next_id = 0u64;
    let won = loop {
        if let Ok(won) = done.try_recv() {
            break won;
        }
        match listener.accept() {
            Ok((mut stream, peer)) => {
                next_id += 1;
                let id = next_id;
                let (spoke, evicted) = match slots.take(id, peer, &stream) {
                    Ok(flags) => flags,
                    Err(e) => {
                        refused(peer, e);
                        continue;
                    }
                };
                let (key, refused, slots, done_tx) = (key.clone(), refused.clone(), slots.clone(), done_tx.clone());
                spawn("ft-handshake", move || {
                    let outcome = handshake_in_slot(&mut stream, &key, &spoke, &evicted);
                    slots.free(id);
                    match outcome {
                        // Dropped (and so closed) if another won first.
                        Ok(session) => drop(done_tx.send((stream, peer, session))),
                        Err(e) => refused(peer, e),
                    }
                })?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Ok(won) = done.recv_timeout(Duration::from_millis(20)) {
                    break won;
                }
            }
            // A connection reset before we took it, or a transient lack
            // of descriptors: neither is the listener's end.
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::ECONNABORTED | libc::EMFILE | libc::ENFILE | libc::EINTR)) =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(ChannelError::Socket(e)),
        }
    };
    listener.set_nonblocking(false).map_err(ChannelError::Socket)?;
    Ok(won)
}

/// The backup's reading of the socket: the log into the pipe, and the
/// acknowledgements back. One at a time: the receiving thread, or the
/// replaying VM's thread while it waits for log.
struct Receipt {
    input: TcpStream,
    opener: Opener,
    /// What the last read opened to, kept to reuse.
    plain: Vec<u8>,
    out: TcpStream,
    sealer: Sealer,
    /// Sealed frames of one write, kept to reuse.
    frames: Vec<u8>,
    buf: Vec<u8>,
    last_ack: Instant,
    /// (bytes received, instructions executed) as last acknowledged.
    acked: (u64, u64),
    /// With an acknowledgement delay: (when, bytes received then), oldest first.
    delayed: VecDeque<(Instant, u64)>,
    released: u64,
    /// Why the channel is over, as the VM's thread found it, for the
    /// receiving thread to declare.
    end: Option<Failure>,
}

/// How a read of the socket ended the receiving.
enum Stop {
    /// The primary is declared failed for this.
    Failed(Failure),
    /// The pipe was closed: the log is over, nothing to declare.
    Closed,
}

impl Receipt {
    /// Takes what has come, up to `room` bytes, into the pipe; how many
    /// (0 when nothing had). The receiving thread may wait in the pipe for
    /// room (see below); `must_fit` is for the VM's thread, which must not:
    /// it reads only what, with the part of a frame already here, fits.
    fn take_arrived(&mut self, shared: &BackupShared, room: usize, must_fit: bool) -> Result<usize, Stop> {
        let room = if must_fit { room.saturating_sub(self.opener.pending()) } else { room };
        let room = room.min(self.buf.len());
        if room == 0 {
            return Ok(0);
        }
        match poll::try_read(&self.input, &mut self.buf[..room]) {
            Ok(None) => Ok(0),
            Ok(Some(0)) => Err(Stop::Failed(Failure::Closed("end of stream".into()))),
            Ok(Some(n)) => {
                self.plain.clear();
                if self.opener.open(&self.buf[..n], &mut self.plain).is_err() {
                    return Err(Stop::Failed(Failure::Unauthentic));
                }
                shared.last_heard_us.store(shared.clock.now_us(), Ordering::Relaxed);
                // What opens may pass `room` by one frame (64 KiB) whose
                // start came in an earlier read: the pipe then waits for
                // room, which only the receiving thread may do. The VM's
                // thread is the pipe's reader, so it waiting here would
                // wait for itself: it never passes `room` (`must_fit`).
                // The receiving thread waits an interval at a time, and
                // between, as for a full pipe, the channel's silence says
                // nothing and the primary hears from us: a slow backup is
                // not a dead one, nor its primary (issue 65: a replay
                // 1.3 s behind left this wait with neither for 500 ms).
                let plain = std::mem::take(&mut self.plain);
                let mut rest = &plain[..];
                let waited = loop {
                    let Some(put) = shared.pipe.put_for(rest, shared.timing.get().interval) else {
                        break Err(Stop::Closed);
                    };
                    shared.received.fetch_add(put as u64, Ordering::Relaxed);
                    rest = &rest[put..];
                    if rest.is_empty() {
                        break Ok(n);
                    }
                    if shared.stop.load(Ordering::Relaxed) {
                        break Err(Stop::Closed);
                    }
                    shared.last_heard_us.store(shared.clock.now_us(), Ordering::Relaxed);
                    if let Err(f) = self.acknowledge(shared) {
                        break Err(Stop::Failed(f));
                    }
                };
                self.plain = plain;
                waited
            }
            Err(e) => Err(Stop::Failed(Failure::Closed(e.to_string()))),
        }
    }

    /// Sends what is due: the requests, then an acknowledgement if more
    /// was received (or executed) since the last, or the interval passed.
    fn acknowledge(&mut self, shared: &BackupShared) -> Result<(), Failure> {
        let received = shared.received.load(Ordering::Relaxed);
        let received = match shared.ack_delay_ms.load(Ordering::Relaxed) {
            0 => received,
            ms => {
                if self.delayed.back().is_none_or(|&(_, r)| r != received) {
                    self.delayed.push_back((Instant::now(), received));
                }
                let due = |t: &Instant| t.elapsed() >= Duration::from_millis(ms);
                while self.delayed.len() > 1 && due(&self.delayed[1].0) {
                    self.delayed.pop_front();
                }
                if let Some((t, r)) = self.delayed.front() {
                    if due(t) {
                        self.released = *r;
                    }
                }
                self.released
            }
        };
        let ready = shared.ready.load(Ordering::Acquire);
        // Requests go before the acknowledgement that says we are ready:
        // every one made before `ready` is in the queue if `ready` is seen.
        for request in std::mem::take(&mut *shared.requests.lock().unwrap()) {
            self.send(&wire::request(request)).map_err(|e| Failure::Closed(e.to_string()))?;
        }
        let received = if ready {
            received
        } else {
            // The primary sends nothing until we acknowledge its header:
            // its silence meanwhile says nothing (heartbeats still do).
            shared.last_heard_us.store(shared.clock.now_us(), Ordering::Relaxed);
            0
        };
        let now = (received, shared.executed.load(Ordering::Relaxed));
        let timing = shared.timing.get();
        if now.0 != self.acked.0 || self.last_ack.elapsed() >= timing.interval {
            let (heard, beat_timeout) = match &*shared.heartbeat.lock().unwrap() {
                Some(h) => (h.log().heard_seq(), h.timeout(timing)),
                None => (0, timing.timeout),
            };
            // Kept before it is told: from the moment the primary may
            // reckon a lease with it, the detector judges by it.
            shared.promises.told(beat_timeout);
            let ms = |d: Duration| d.as_millis().min(u32::MAX as u128) as u32;
            let ack = wire::ack(now.0, now.1, heard, ms(timing.timeout), ms(beat_timeout));
            self.send(&ack).map_err(|e| Failure::Closed(e.to_string()))?;
            self.acked = now;
            self.last_ack = Instant::now();
        }
        Ok(())
    }

    fn refuse(&mut self, why: &str) {
        let _ = self.send(&wire::refusal(why));
        let _ = self.out.shutdown(Shutdown::Write);
    }

    /// Seals one message to the primary and writes it.
    fn send(&mut self, msg: &[u8]) -> std::io::Result<()> {
        self.frames.clear();
        self.sealer.seal(msg, &mut self.frames);
        self.out.write_all(&self.frames)
    }
}

impl BackupShared {
    /// The replaying VM's thread, waiting for log, takes what has come
    /// and acknowledges it, as the receiving thread would. False when it
    /// must leave that to the receiving thread: the channel is over, or
    /// the acknowledgements are held (not ready, or delayed), which only
    /// that thread handles.
    fn read_while_waiting(&self) -> bool {
        if !self.ready.load(Ordering::Acquire) || self.ack_delay_ms.load(Ordering::Relaxed) != 0 {
            return false;
        }
        // Nothing came: the receipt is not taken for a look. The VM's
        // thread, unlike the receiving one, may be kept off the CPU at
        // any moment on a loaded host; holding the receipt meanwhile, it
        // would keep the receiving thread from reading and acknowledging
        // (issue 65), so it holds it only to take what came.
        if let Some(socket) = self.socket.get() {
            if !poll::readable_within(socket, Duration::ZERO).unwrap_or(true) {
                return true;
            }
        }
        // Held by the receiving thread: it is taking the bytes for us.
        let Ok(mut guard) = self.receipt.try_lock() else { return true };
        let Some(rx) = guard.as_mut() else { return false };
        if rx.end.is_some() || self.stop.load(Ordering::Relaxed) {
            return false;
        }
        // Only the reader makes room: it must not wait for any.
        let ended = match rx.take_arrived(self, self.pipe.free(), true) {
            Ok(0) => return true,
            Ok(_) => rx.acknowledge(self).err(),
            Err(Stop::Failed(f)) => Some(f),
            Err(Stop::Closed) => return false,
        };
        match ended {
            None => true,
            Some(f) => {
                rx.end = Some(f);
                false
            }
        }
    }
}

/// The receiving thread: takes the log as it comes and acknowledges it,
/// and acknowledges every interval while nothing comes, except while the
/// VM's thread reads the socket itself. `readable` is the socket, to
/// wait on without holding the [`Receipt`].
fn receive(shared: &BackupShared, readable: &TcpStream, fail: &dyn Fn(Failure)) {
    loop {
        let timing = shared.timing.get();
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        if let Some(why) = shared.refusal.lock().unwrap().take() {
            if let Some(rx) = shared.receipt.lock().unwrap().as_mut() {
                rx.refuse(&why);
            }
            shared.refused.store(true, Ordering::Relaxed);
            return;
        }
        if shared.log_turn.thread_keeps_off() {
            continue;
        }
        // A full buffer stops the reading (the primary's buffer fills in
        // turn) but not the acknowledgements: a slow backup is not a dead one.
        let room = shared.pipe.room(timing.interval);
        if room > 0 {
            if let Err(e) = poll::wait_readable(readable, timing.interval) {
                return fail(Failure::Closed(e.to_string()));
            }
        } else {
            // Not reading, so the channel's silence says nothing.
            shared.last_heard_us.store(shared.clock.now_us(), Ordering::Relaxed);
        }
        let mut guard = shared.receipt.lock().unwrap();
        let rx = guard.as_mut().expect("started");
        if let Some(f) = rx.end.take() {
            return fail(f);
        }
        let got = match rx.take_arrived(shared, room, false) {
            Ok(n) => n,
            Err(Stop::Closed) => return,
            Err(Stop::Failed(f)) => return fail(f),
        };
        if let Err(f) = rx.acknowledge(shared) {
            return fail(f);
        }
        drop(guard);
        // The replay is woken after the acknowledgement is written: woken
        // first, it could take the core before the primary, which may be
        // waiting, hears from us.
        if got > 0 {
            shared.pipe.wake_reader();
        }
    }
}

/// The log as the replaying VM reads it: blocks while the buffer is empty
/// (the backup stalls), ends once the receiver ended the log and every
/// byte received has been read.
pub struct LogPipe {
    shared: Arc<BackupShared>,
}

impl Read for LogPipe {
    /// Takes what the primary sent, waiting for some. Before it sleeps the
    /// VM's thread reads the socket itself for a moment, and acknowledges
    /// what it reads, while the receiving thread keeps off (see `poll`):
    /// the bytes of a short round trip (an output waiting for its
    /// acknowledgement, an epoch end under the original protocol) come
    /// within it, and no thread needs waking, or switching to, for them.
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let (shared, pipe) = (&*self.shared, &self.shared.pipe);
        if pipe.len() == 0 {
            shared.log_turn.begin();
            let spin_until = Instant::now() + SPIN_FOR;
            while pipe.len() == 0 && !pipe.is_closed() && Instant::now() < spin_until {
                if !shared.read_while_waiting() {
                    break;
                }
                std::hint::spin_loop();
            }
            // Log came, and the next wait is soon (the next epoch end):
            // keep the socket until then. Otherwise the receiving thread
            // takes it back now.
            let keep = pipe.len() > 0 && shared.short_waits.load(Ordering::Relaxed);
            shared.log_turn.end(if keep { WAITER_GRACE } else { Duration::ZERO });
        }
        let got = pipe.take(buf.len());
        buf[..got.len()].copy_from_slice(&got);
        Ok(got.len())
    }
}
