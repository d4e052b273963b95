//! The primary's end of the logging channel ([`LogSender`]): the log
//! written into a bounded pipe and flushed to the socket in batches, the
//! backup's acknowledgements, requests and refusal read back, and the
//! failure detector for the backup.

use super::failure::{declare, detect, Failure};
use super::pipe::Pipe;
use super::secure::{self, Opener, Sealer, Session};
use super::wire::{self, Message};
use super::{spawn_mover, spawn_watcher, ChannelError, Clock, SPIN_FOR, WAITER_GRACE};
use crate::fence::{self, Fence};
use crate::heartbeat::{Heartbeat, HeartbeatLog};
use crate::pair_key::PairKey;
use crate::poll::{self, WaiterTurn};
use crate::{LiveTiming, Timing};
use std::collections::VecDeque;
use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long each side gives the other to complete the handshake.
pub const HANDSHAKE_WAIT: Duration = Duration::from_secs(10);

/// Connects to the backup's logging address, retrying for `wait` while it
/// is not listening yet, and proves to it (and it to us) that both hold
/// `key`.
pub fn connect(backup: SocketAddr, wait: Duration, key: &PairKey) -> Result<(TcpStream, Session), ChannelError> {
    let deadline = Instant::now() + wait;
    let mut stream = loop {
        match TcpStream::connect_timeout(&backup, Duration::from_secs(1)) {
            Ok(s) => break s,
            Err(source) if Instant::now() >= deadline => return Err(ChannelError::Unreachable { backup, source }),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let session = secure::initiate(&mut stream, key, HANDSHAKE_WAIT)
        .map_err(|source| ChannelError::Handshake { peer: backup, source })?;
    Ok((stream, session))
}

/// What a primary learns from its channel, from another thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrimaryEvent {
    /// The backup acknowledged more of the log.
    Acked,
    /// The backup is declared failed.
    BackupLost(Failure),
}

struct PrimaryShared {
    clock: Clock,
    pipe: Pipe,
    /// Bytes handed to the socket.
    sent: AtomicU64,
    /// Bytes the writer gave us.
    written: AtomicU64,
    acked: AtomicU64,
    /// Signalled when `acked` grows or the backup is declared failed, for
    /// [`LogSender::wait_acked`]: a primary waiting at every epoch end
    /// must wake within microseconds, not at the next poll.
    ack_signal: (Mutex<()>, Condvar),
    backup_icount: AtomicU64,
    /// When `backup_icount` was last reported (stored after it).
    backup_report_us: AtomicU64,
    last_ack_us: AtomicU64,
    failed: Mutex<Option<Failure>>,
    stop: AtomicBool,
    /// The backup's requests, in the order they came.
    requests: Mutex<Vec<Vec<u8>>>,
    /// The right to release outputs, renewed by each acknowledgement.
    fence: Fence,
    timing: LiveTiming,
    /// The backup's failure timeout as its last acknowledgement said (µs).
    backup_timeout_us: AtomicU64,
    /// The backup's heartbeat timeout as its last acknowledgement said (µs).
    backup_beat_timeout_us: AtomicU64,
    /// Our heartbeats' send times, if the backup watches them too.
    heartbeat: Option<HeartbeatLog>,
    /// (bytes sent once the write was done, CLOCK_BOOTTIME ns as it
    /// began), oldest first: when a byte the backup acknowledges was sent.
    write_times: Mutex<VecDeque<(u64, u64)>>,
    /// The backup's messages, read by the reader thread or by a caller
    /// waiting for an acknowledgement, whoever gets there first.
    acks: Mutex<AckStream>,
    /// Whether a caller waiting for an acknowledgement reads them itself
    /// (for [`WAITER_GRACE`] after its wait too), the reader thread
    /// keeping off the socket.
    acks_turn: WaiterTurn,
    /// When a frame (log or keep-alive) was last written ([`Clock`] µs).
    last_sent_us: AtomicU64,
    /// The socket's writing end. Whoever takes bytes from `pipe` holds it
    /// until they are written, so the stream keeps the pipe's order
    /// whether the sender thread writes them or a waiting caller does
    /// (and the frames their nonces' order).
    out: Mutex<SealedOut>,
}

/// When the backup last heard from us, by what an acknowledgement proves
/// (CLOCK_BOOTTIME ns).
struct Heard {
    /// The start of the write that held the last byte it received.
    channel: u64,
    /// The sending of the last heartbeat it heard, if it watches them.
    beat: Option<u64>,
}

/// The socket's writing end and what seals for it.
struct SealedOut {
    stream: TcpStream,
    sealer: Sealer,
    /// The sealed frames of one write, kept to reuse.
    frames: Vec<u8>,
}

impl PrimaryShared {
    /// A write to the backup failed with `e`. A backup that refuses to
    /// follow says why and closes the channel, and the write that finds
    /// it closed may come before the reader has read why: what came is
    /// read first, and the refusal is the failure declared, not the write's
    /// broken pipe.
    fn write_failed(&self, e: std::io::Error, events: &dyn Fn(PrimaryEvent), fail: &dyn Fn(Failure)) {
        let mut acks = self.acks.lock().unwrap();
        match acks.pump(self, events) {
            Err(f @ Failure::Refused(_)) => fail(f),
            _ => fail(Failure::Closed(e.to_string())),
        }
    }

    /// Writes what waits in the pipe, or nothing if it is empty; the
    /// bytes are counted as sent.
    fn write_pending(&self, max: usize) -> std::io::Result<usize> {
        let mut out = self.out.lock().unwrap();
        let chunk = self.pipe.try_take(max);
        if !chunk.is_empty() {
            let SealedOut { stream, sealer, frames } = &mut *out;
            frames.clear();
            sealer.seal(&chunk, frames);
            let began = fence::now_ns();
            stream.write_all(frames)?;
            self.last_sent_us.store(self.clock.now_us(), Ordering::Relaxed);
            let sent = self.sent.fetch_add(chunk.len() as u64, Ordering::Relaxed) + chunk.len() as u64;
            self.write_times.lock().unwrap().push_back((sent, began));
        }
        Ok(chunk.len())
    }

    /// Writes a frame that carries no log if nothing was written for the
    /// heartbeat interval: the backup's detector hears the channel from
    /// this thread, whatever keeps the VM's threads from writing log (a
    /// checkpoint being compressed, a loaded host). It acknowledges no
    /// log, so it renews no lease.
    fn keep_alive(&self) -> std::io::Result<()> {
        if self.clock.since(self.last_sent_us.load(Ordering::Relaxed)) < self.timing.get().interval {
            return Ok(());
        }
        let mut out = self.out.lock().unwrap();
        let SealedOut { stream, sealer, frames } = &mut *out;
        frames.clear();
        sealer.seal_nothing(frames);
        stream.write_all(frames)?;
        self.last_sent_us.store(self.clock.now_us(), Ordering::Relaxed);
        Ok(())
    }

    /// When the backup last heard from us, as an acknowledgement of
    /// `received` bytes, naming our heartbeat `heartbeat`, proves: the
    /// start of the write that held the last byte received, and the
    /// heartbeat's sending (the backup declares us failed when either
    /// falls silent, each after a timeout of its own). None if it proves
    /// nothing (no byte yet, or a watched heartbeat it has not heard).
    fn heard_at(&self, received: u64, heartbeat: u64) -> Option<Heard> {
        let channel = {
            let mut times = self.write_times.lock().unwrap();
            // Acknowledgements only grow: writes wholly before this one
            // are not asked about again.
            while times.len() > 1 && times[0].0 < received {
                times.pop_front();
            }
            times.front().filter(|&&(end, _)| received > 0 && end >= received).map(|&(_, t)| t)?
        };
        match &self.heartbeat {
            None => Some(Heard { channel, beat: None }),
            Some(log) => log.sent_at(heartbeat).map(|beat| Heard { channel, beat: Some(beat) }),
        }
    }

    /// When the backup is judged failed: after our timeout, or the
    /// backup's if longer (a shorter one we chose may not have reached it
    /// yet, and until it has, it beats and acknowledges at its old pace).
    fn detection_timing(&self) -> Timing {
        let mut t = self.timing.get();
        t.timeout = t.timeout.max(Duration::from_micros(self.backup_timeout_us.load(Ordering::Relaxed)));
        t
    }

    fn signal_ack_waiters(&self) {
        let _guard = self.ack_signal.0.lock().unwrap();
        self.ack_signal.1.notify_all();
    }
}

/// The backup's messages as the primary reads them, without blocking, by
/// whichever thread comes first.
struct AckStream {
    input: TcpStream,
    opener: Opener,
    /// The bytes of a message that has not all come yet (opened).
    partial: Vec<u8>,
    /// What a read takes, kept: a waiter pumps in a tight loop, and a
    /// fresh buffer would be zeroed at every turn.
    chunk: Box<[u8]>,
}

impl AckStream {
    /// Reads what has come and applies every whole message; an error is
    /// the failure to declare.
    fn pump(&mut self, shared: &PrimaryShared, events: &dyn Fn(PrimaryEvent)) -> Result<(), Failure> {
        loop {
            match poll::try_read(&self.input, &mut self.chunk) {
                Ok(Some(0)) => {
                    self.apply(shared, events)?;
                    return Err(wire::at_end(&self.partial));
                }
                Ok(Some(n)) => {
                    self.opener.open(&self.chunk[..n], &mut self.partial).map_err(|_| Failure::Unauthentic)?
                }
                Ok(None) => return self.apply(shared, events),
                Err(e) => return Err(Failure::Closed(e.to_string())),
            }
        }
    }

    fn apply(&mut self, shared: &PrimaryShared, events: &dyn Fn(PrimaryEvent)) -> Result<(), Failure> {
        let mut at = 0;
        while let Some((msg, len)) = wire::parse(&self.partial[at..])? {
            match msg {
                Message::Ack { received, icount, heartbeat, timeout_ms, beat_timeout_ms } => {
                    if let Some(heard) = shared.heard_at(received, heartbeat) {
                        // The lease runs no longer than either side's
                        // timeout: the backup's bounds when it may go
                        // live; ours is the lower while a shorter one we
                        // chose is on its way to it (see `set_timeout`).
                        // It ends where the first of the backup's two
                        // silences (channel, beats) could end.
                        let ours = shared.timing.get().timeout;
                        let ms = |ms: u32| Duration::from_millis(ms as u64).min(ours);
                        let mut until = fence::lease_end(heard.channel, ms(timeout_ms));
                        if let Some(beat) = heard.beat {
                            until = until.min(fence::lease_end(beat, ms(beat_timeout_ms)));
                        }
                        shared.fence.renew_until(until);
                    }
                    shared.backup_beat_timeout_us.store(beat_timeout_ms as u64 * 1000, Ordering::Relaxed);
                    shared.backup_timeout_us.store(timeout_ms as u64 * 1000, Ordering::Relaxed);
                    let now = shared.clock.now_us();
                    shared.last_ack_us.store(now, Ordering::Relaxed);
                    shared.backup_icount.fetch_max(icount, Ordering::Relaxed);
                    shared.backup_report_us.store(now, Ordering::Release);
                    if received > shared.acked.fetch_max(received, Ordering::Relaxed) {
                        shared.signal_ack_waiters();
                        events(PrimaryEvent::Acked);
                    }
                }
                Message::Request(request) => {
                    shared.last_ack_us.store(shared.clock.now_us(), Ordering::Relaxed);
                    shared.requests.lock().unwrap().push(request.to_vec());
                }
                Message::Refuse(why) => return Err(Failure::Refused(why)),
            }
            at += len;
        }
        self.partial.drain(..at);
        Ok(())
    }
}

/// The primary's end. Implements [`Write`] for the log writer.
///
/// Written bytes are batched: the sender thread is woken when someone
/// needs them out ([`LogSender::send_now`]: an output waits for them, or
/// the writer waits for their acknowledgement), when [`SEND_DELAY`] has
/// passed since the oldest of them was written, or when [`SEND_BATCH`]
/// bytes wait. Waking it for every frame would cost a context switch and
/// a system call per frame, which short epochs pay thousands of times a
/// second; bytes no output depends on lose nothing by waiting a moment.
pub struct LogSender {
    /// The channel's state, and the reads of it other threads make too.
    watch: SenderWatch,
    stream: TcpStream,
    /// When the oldest byte the sender thread was not woken for was
    /// written.
    unsent_since: std::cell::Cell<Option<Instant>>,
    /// Declares the backup failed (a write of ours failed).
    fail: Arc<dyn Fn(Failure) + Send + Sync>,
    /// Whoever listens to the backup's acknowledgements.
    events: Arc<dyn Fn(PrimaryEvent) + Send + Sync>,
}

/// Longest a written byte waits before the sender thread is woken for it.
pub const SEND_DELAY: Duration = Duration::from_millis(1);
/// Bytes that make the sender thread be woken at once.
pub(super) const SEND_BATCH: u64 = 64 << 10;

impl LogSender {
    /// The primary's end over a connected stream and its session; each
    /// acknowledgement renews `fence`'s lease.
    pub fn over(
        stream: TcpStream,
        session: Session,
        buffer: usize,
        timing: impl Into<LiveTiming>,
        heartbeat: Option<Heartbeat>,
        fence: Fence,
        events: impl Fn(PrimaryEvent) + Send + Sync + 'static,
    ) -> Result<LogSender, ChannelError> {
        let peer = stream.peer_addr().map_err(ChannelError::Socket)?;
        // Outputs wait for acknowledgements: no Nagle delay on either side.
        stream.set_nodelay(true).map_err(ChannelError::Socket)?;
        let (sealer, opener) = session.split();
        let shared = Arc::new(PrimaryShared {
            clock: Clock(Instant::now()),
            pipe: Pipe::new(buffer),
            sent: AtomicU64::new(0),
            written: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            ack_signal: (Mutex::new(()), Condvar::new()),
            backup_icount: AtomicU64::new(0),
            backup_report_us: AtomicU64::new(0),
            last_ack_us: AtomicU64::new(0),
            failed: Mutex::new(None),
            stop: AtomicBool::new(false),
            requests: Mutex::new(Vec::new()),
            fence,
            timing: timing.into(),
            backup_timeout_us: AtomicU64::new(0),
            backup_beat_timeout_us: AtomicU64::new(0),
            heartbeat: heartbeat.as_ref().map(Heartbeat::log),
            write_times: Mutex::new(VecDeque::new()),
            last_sent_us: AtomicU64::new(0),
            acks_turn: WaiterTurn::default(),
            acks: Mutex::new(AckStream {
                input: stream.try_clone().map_err(ChannelError::Socket)?,
                opener,
                partial: Vec::new(),
                chunk: vec![0u8; 4096].into_boxed_slice(),
            }),
            out: Mutex::new(SealedOut {
                stream: stream.try_clone().map_err(ChannelError::Socket)?,
                sealer,
                frames: Vec::new(),
            }),
        });
        let events: Arc<dyn Fn(PrimaryEvent) + Send + Sync> = Arc::new(events);
        let fail = {
            let (shared, events) = (shared.clone(), events.clone());
            let socket = stream.try_clone().map_err(ChannelError::Socket)?;
            move |f: Failure| {
                if declare(&shared.failed, &f) {
                    shared.pipe.close();
                    events(PrimaryEvent::BackupLost(f));
                }
                // A write blocked on a backup that stopped reading (the
                // sender thread's, or a waiting caller's) returns now.
                let _ = socket.shutdown(Shutdown::Both);
                shared.signal_ack_waiters();
            }
        };
        let fail = Arc::new(fail);
        {
            let (shared, fail, events) = (shared.clone(), fail.clone(), events.clone());
            spawn_mover("ft-log-send", move || {
                while let Some(readable) = shared.pipe.wait_readable_for(shared.timing.get().interval / 2) {
                    // A waiting caller may have written them meanwhile.
                    let written = if readable { shared.write_pending(1 << 20).map(drop) } else { shared.keep_alive() };
                    if let Err(e) = written {
                        return shared.write_failed(e, &*events, &*fail);
                    }
                }
            })?;
        }
        {
            let (shared, fail, events) = (shared.clone(), fail.clone(), events.clone());
            let input = stream.try_clone().map_err(ChannelError::Socket)?;
            spawn_watcher("ft-ack-read", move || loop {
                if shared.acks_turn.thread_keeps_off() {
                    continue;
                }
                if let Err(e) = poll::wait_readable(&input, Duration::from_secs(1)) {
                    return fail(Failure::Closed(e.to_string()));
                }
                // Declared with the stream held, so that a write failing
                // meanwhile finds the refusal declared (`write_failed`).
                let mut acks = shared.acks.lock().unwrap();
                if let Err(f) = acks.pump(&shared, &*events) {
                    return fail(f);
                }
            })?;
        }
        {
            let (shared, fail) = (shared.clone(), fail.clone());
            spawn_watcher("ft-detect", move || {
                let heartbeat = Mutex::new(heartbeat);
                detect(
                    || shared.detection_timing(),
                    &heartbeat,
                    |hb, timing| hb.timeout(timing),
                    &shared.stop,
                    &shared.failed,
                    || shared.clock.since(shared.last_ack_us.load(Ordering::Relaxed)),
                    |f| fail(f),
                )
            })?;
        }
        Ok(LogSender {
            watch: SenderWatch { shared, peer },
            stream,
            unsent_since: std::cell::Cell::new(None),
            fail,
            events,
        })
    }

    pub fn peer(&self) -> SocketAddr {
        self.watch.peer()
    }

    /// A handle for other threads to follow this channel with.
    pub fn watch(&self) -> SenderWatch {
        self.watch.clone()
    }

    /// Bytes of log the backup has acknowledged receiving.
    pub fn acked(&self) -> u64 {
        self.watch.acked()
    }

    /// Bytes handed to the network so far.
    pub fn sent(&self) -> u64 {
        self.watch.sent()
    }

    /// Bytes of log written into the channel so far.
    pub fn written(&self) -> u64 {
        self.watch.written()
    }

    /// Bytes waiting in the primary's buffer.
    pub fn buffered(&self) -> usize {
        self.watch.shared.pipe.len()
    }

    /// The instruction count the backup last reported executing.
    pub fn backup_icount(&self) -> u64 {
        self.watch.backup_icount()
    }

    /// The instruction count the backup last reported executing, and how
    /// long ago that report came. Between reports the backup runs on, so
    /// its lag is best measured as of the report, not as of now.
    pub fn backup_report(&self) -> (u64, Duration) {
        // The time is stored after the count: a report landing between
        // these loads can only make one sample's age short, never long.
        let at = self.watch.shared.backup_report_us.load(Ordering::Acquire);
        (self.backup_icount(), self.watch.shared.clock.since(at))
    }

    /// Why the backup was declared failed, once it has been.
    /// The right to release outputs that this channel's acknowledgements
    /// renew.
    pub fn fence(&self) -> Fence {
        self.watch.shared.fence.clone()
    }

    pub fn failure(&self) -> Option<Failure> {
        self.watch.failure()
    }

    /// What the backup asked before it acknowledged anything
    /// ([`LogReceiver::request`](super::LogReceiver::request)), oldest first. Every request it made
    /// before it became ready is here once its first acknowledgement is.
    pub fn take_requests(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut *self.watch.shared.requests.lock().unwrap())
    }

    /// Stops sending and lets the backup's end see the stream end.
    pub fn close(&self) {
        self.watch.shared.stop.store(true, Ordering::Relaxed);
        self.watch.shared.pipe.close();
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Waits (up to `wait`) until everything written has been
    /// acknowledged: the end of a recording reaches the backup before the
    /// primary goes away.
    pub fn wait_acked(&self, total: u64, wait: Duration) -> bool {
        // The caller waits anyway, so it writes the bytes itself rather
        // than wake the sender thread for them: at an epoch end under the
        // original protocol this is on the path of every round trip.
        self.unsent_since.set(None);
        if let Err(e) = self.watch.shared.write_pending(usize::MAX) {
            self.watch.shared.write_failed(e, &*self.events, &*self.fail);
        }
        let deadline = Instant::now() + wait;
        // The acknowledgement of a short log comes within a round trip: we
        // read it ourselves as it comes rather than sleep and have the
        // reader thread woken for it and wake us in turn, two wake-ups
        // that cost more than the network here (see `poll`).
        let spin_until = Instant::now() + SPIN_FOR;
        let turn = &self.watch.shared.acks_turn;
        turn.begin();
        while self.acked() < total && self.failure().is_none() && Instant::now() < spin_until {
            if let Ok(mut acks) = self.watch.shared.acks.try_lock() {
                if let Err(f) = acks.pump(&self.watch.shared, &*self.events) {
                    (self.fail)(f);
                }
            }
            std::hint::spin_loop();
        }
        if self.acked() >= total {
            turn.end(WAITER_GRACE);
            return true;
        }
        // A longer wait: the reader thread takes over.
        turn.end(Duration::ZERO);
        let (lock, signal) = &self.watch.shared.ack_signal;
        let mut guard = lock.lock().unwrap();
        loop {
            if self.acked() >= total {
                return true;
            }
            let now = Instant::now();
            if now >= deadline || self.failure().is_some() {
                return false;
            }
            guard = signal.wait_timeout(guard, deadline - now).unwrap().0;
        }
    }
}

/// What another thread needs to know of a [`LogSender`] whose writing
/// one thread owns: how far the backup has acknowledged, and whether it
/// failed.
#[derive(Clone)]
pub struct SenderWatch {
    shared: Arc<PrimaryShared>,
    peer: SocketAddr,
}

impl SenderWatch {
    /// The right to release outputs that the channel's acknowledgements
    /// renew.
    pub fn fence(&self) -> Fence {
        self.shared.fence.clone()
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    pub fn acked(&self) -> u64 {
        self.shared.acked.load(Ordering::Relaxed)
    }

    pub fn sent(&self) -> u64 {
        self.shared.sent.load(Ordering::Relaxed)
    }

    pub fn written(&self) -> u64 {
        self.shared.written.load(Ordering::Relaxed)
    }

    pub fn backup_icount(&self) -> u64 {
        self.shared.backup_icount.load(Ordering::Relaxed)
    }

    pub fn failure(&self) -> Option<Failure> {
        self.shared.failed.lock().unwrap().clone()
    }

    /// This side's failure timeout.
    pub fn timeout(&self) -> Duration {
        self.shared.timing.get().timeout
    }

    /// The backup's failure timeout, as its last acknowledgement said
    /// (None before the first).
    pub fn backup_timeout(&self) -> Option<Duration> {
        Some(Duration::from_micros(self.shared.backup_timeout_us.load(Ordering::Relaxed))).filter(|d| !d.is_zero())
    }

    /// Changes this side's failure timeout now, before the backup is told
    /// (the caller sends it the change as a control entry): the lease at
    /// once runs no longer than the new timeout, and no longer than the
    /// backup's until it says it has taken the change.
    pub fn set_timeout(&self, timeout: Duration) {
        self.shared.timing.fix(timeout);
    }

    /// The backup's heartbeat timeout, as its last acknowledgement said
    /// (None before the first): how soon it declares us failed when our
    /// beats stop.
    pub fn backup_heartbeat_timeout(&self) -> Option<Duration> {
        Some(Duration::from_micros(self.shared.backup_beat_timeout_us.load(Ordering::Relaxed))).filter(|d| !d.is_zero())
    }

    /// Our heartbeat timeout now: how soon we declare the backup failed
    /// when its beats stop (the timeout if we watch none).
    pub fn heartbeat_timeout(&self) -> Duration {
        let timing = self.shared.timing.get();
        self.shared.heartbeat.as_ref().map_or(timing.timeout, |log| log.timeout(timing))
    }
}

impl LogSender {
    /// Has everything written so far sent now.
    pub fn send_now(&self) {
        if self.unsent_since.take().is_some() {
            self.watch.shared.pipe.wake_reader();
        }
    }

    /// Has what was written sent if it has waited [`SEND_DELAY`].
    pub fn send_if_due(&self) {
        if self.unsent_since.get().is_some_and(|t| t.elapsed() >= SEND_DELAY) {
            self.send_now();
        }
    }
}

impl Write for LogSender {
    /// Queues log bytes; a full buffer makes the caller wait. Once the
    /// backup is declared failed the bytes go nowhere: the caller learns
    /// of it through its event, not through an error in the middle of a
    /// log entry.
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let since = *self.unsent_since.get_mut().get_or_insert_with(Instant::now);
        let unsent = self.written() - self.sent();
        let wake = unsent + buf.len() as u64 >= SEND_BATCH || since.elapsed() >= SEND_DELAY;
        self.watch.shared.pipe.put(buf, wake);
        if wake {
            self.unsent_since.set(None);
        }
        self.watch.shared.written.fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogSender {
    /// As if the primary's process ended: the backup sees the stream end
    /// (call [`LogSender::wait_acked`] first to deliver what was written).
    fn drop(&mut self) {
        self.close();
    }
}
