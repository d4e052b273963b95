//! The logging channel (VMware FT §2, §3.2, Figure 3): a TCP connection
//! from primary to backup carrying the replay log as one byte stream, and
//! acknowledgements back.
//!
//! Primary end ([`LogSender`]): the VM thread writes log bytes into a
//! bounded buffer that a sender thread flushes to the socket as soon as
//! they come; a full buffer stalls the writer (the VM). A reader thread
//! takes acknowledgements.
//!
//! Backup end ([`LogReceiver`]): a thread reads the socket into a bounded
//! buffer that the replaying VM consumes through [`LogPipe`] (an empty
//! buffer stalls the VM, whose thread then reads the socket itself for a
//! moment); each read is acknowledged at once, on receipt, not on
//! execution (§3.2). A full buffer stops the reading, so the primary's
//! buffer fills and the primary stalls in turn.
//!
//! An acknowledgement is 17 bytes: kind (1), bytes of log received (u64
//! LE), instruction count the backup has executed (u64 LE). The latter is
//! what the primary measures the execution lag with. Acknowledgements
//! also go out every interval while nothing arrives, so they double as
//! the backup's heartbeat on the channel; the primary's keep-alives are
//! log frames its VM loop writes when the log is quiet.
//!
//! Each end declares its peer failed (§2.3) when the connection closes
//! (the peer's process is gone and its kernel said so), or when either
//! the channel or the UDP heartbeats have been silent for the timeout.

use crate::heartbeat::Heartbeat;
use crate::poll::{self, WaiterTurn};
use crate::Timing;
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const ACK: u8 = 1;
const ACK_LEN: usize = 17;
/// The backup will not follow this primary: kind, length (u16 LE), reason.
const REFUSE: u8 = 2;
/// Something the backup asks of the primary before it is ready to follow
/// (what it asks is the caller's business): kind, length (u32 LE), bytes.
const REQUEST: u8 = 3;
/// Largest request a primary takes.
pub const MAX_REQUEST: usize = 16 << 20;
/// Default size of each end's buffer (VMware speaks of "a large buffer").
pub const DEFAULT_BUFFER: usize = 64 << 20;

/// Why a peer was declared failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The connection closed or broke.
    Closed(String),
    /// Nothing on the channel for the timeout.
    ChannelSilent(Duration),
    /// No heartbeat for the timeout.
    HeartbeatSilent(Duration),
    /// The backup refused to follow (its reason).
    Refused(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Failure::Closed(why) => write!(f, "the logging channel closed ({why})"),
            Failure::ChannelSilent(d) => write!(f, "nothing on the logging channel for {} ms", d.as_millis()),
            Failure::HeartbeatSilent(d) => write!(f, "no heartbeat for {} ms", d.as_millis()),
            Failure::Refused(why) => write!(f, "the backup refused: {why}"),
        }
    }
}

/// Microsecond clock shared by the threads of one end.
struct Clock(Instant);

impl Clock {
    fn now_us(&self) -> u64 {
        self.0.elapsed().as_micros() as u64
    }
    fn since(&self, us: u64) -> Duration {
        Duration::from_micros(self.now_us().saturating_sub(us))
    }
}

/// A byte buffer with a bound, shared by a producer and a consumer thread.
struct Pipe {
    state: Mutex<PipeState>,
    readable: Condvar,
    writable: Condvar,
    /// Signalled when the reader has taken everything and waits for more,
    /// or reads no more (see [`Pipe::wait_consumed`]).
    consumed: Condvar,
    capacity: usize,
}

struct PipeState {
    bytes: VecDeque<u8>,
    /// No more bytes will come (the channel is over): readers drain, then
    /// see the end; writers drop what they write.
    closed: bool,
    /// The reader took every byte there was and waits for more.
    starved: bool,
    /// The reader takes no more: it reached what it was reading for.
    reader_done: bool,
}

impl Pipe {
    fn new(capacity: usize) -> Pipe {
        Pipe {
            state: Mutex::new(PipeState { bytes: VecDeque::new(), closed: false, starved: false, reader_done: false }),
            readable: Condvar::new(),
            writable: Condvar::new(),
            consumed: Condvar::new(),
            capacity,
        }
    }

    /// Appends all of `data`, waiting for room; the reader is woken only
    /// if `wake` (or to make room). False if closed.
    fn put(&self, mut data: &[u8], wake: bool) -> bool {
        let mut s = self.state.lock().unwrap();
        while !data.is_empty() {
            if s.closed {
                return false;
            }
            let room = self.capacity.saturating_sub(s.bytes.len());
            if room == 0 {
                self.readable.notify_all();
                s = self.writable.wait(s).unwrap();
                continue;
            }
            let n = room.min(data.len());
            s.bytes.extend(&data[..n]);
            data = &data[n..];
        }
        if wake {
            self.readable.notify_all();
        }
        true
    }

    /// Wakes the reader for what is there.
    fn wake_reader(&self) {
        let _s = self.state.lock().unwrap();
        self.readable.notify_all();
    }

    /// Takes up to `max` bytes, waiting for some; empty once closed and drained.
    fn take(&self, max: usize) -> Vec<u8> {
        let mut s = self.wait_for_bytes();
        self.drain(&mut s, max)
    }

    /// Waits until the reader has taken every byte and waits for more
    /// (true), or has said it reads no more (false).
    fn wait_consumed(&self) -> bool {
        let s = self.state.lock().unwrap();
        let s = self.consumed.wait_while(s, |s| !(s.reader_done || s.starved && s.bytes.is_empty())).unwrap();
        !s.reader_done
    }

    /// The reader takes no more.
    fn reader_done(&self) {
        self.state.lock().unwrap().reader_done = true;
        self.consumed.notify_all();
    }

    /// Takes up to `max` bytes without waiting.
    fn try_take(&self, max: usize) -> Vec<u8> {
        self.drain(&mut self.state.lock().unwrap(), max)
    }

    /// Waits until there are bytes to take; false once closed and drained.
    fn wait_readable(&self) -> bool {
        !self.wait_for_bytes().bytes.is_empty()
    }

    /// Waits while the pipe is empty and open, starved meanwhile.
    fn wait_for_bytes(&self) -> std::sync::MutexGuard<'_, PipeState> {
        let mut s = self.state.lock().unwrap();
        while s.bytes.is_empty() && !s.closed {
            s.starved = true;
            self.consumed.notify_all();
            s = self.readable.wait(s).unwrap();
        }
        s.starved = false;
        s
    }

    fn drain(&self, s: &mut PipeState, max: usize) -> Vec<u8> {
        let n = max.min(s.bytes.len());
        let out: Vec<u8> = s.bytes.drain(..n).collect();
        if n > 0 {
            self.writable.notify_all();
        }
        out
    }

    /// Free room, waiting up to `wait` for some.
    fn room(&self, wait: Duration) -> usize {
        let s = self.state.lock().unwrap();
        let (s, _) =
            self.writable.wait_timeout_while(s, wait, |s| s.bytes.len() >= self.capacity && !s.closed).unwrap();
        self.capacity.saturating_sub(s.bytes.len())
    }

    /// Free room now.
    fn free(&self) -> usize {
        self.capacity.saturating_sub(self.len())
    }

    fn close(&self) {
        self.state.lock().unwrap().closed = true;
        self.readable.notify_all();
        self.writable.notify_all();
    }

    fn len(&self) -> usize {
        self.state.lock().unwrap().bytes.len()
    }

    fn is_closed(&self) -> bool {
        self.state.lock().unwrap().closed
    }
}

/// Connects to the backup's logging address, retrying for `wait` while it
/// is not listening yet.
pub fn connect(backup: SocketAddr, wait: Duration) -> Result<TcpStream, String> {
    let deadline = Instant::now() + wait;
    loop {
        match TcpStream::connect_timeout(&backup, Duration::from_secs(1)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => return Err(format!("cannot reach the backup at {backup}: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
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
    /// The backup's messages, read by the reader thread or by a caller
    /// waiting for an acknowledgement, whoever gets there first.
    acks: Mutex<AckStream>,
    /// Whether a caller waiting for an acknowledgement reads them itself
    /// (for [`WAITER_GRACE`] after its wait too), the reader thread
    /// keeping off the socket.
    acks_turn: WaiterTurn,
    /// The socket's writing end. Whoever takes bytes from `pipe` holds it
    /// until they are written, so the stream keeps the pipe's order
    /// whether the sender thread writes them or a waiting caller does.
    out: Mutex<TcpStream>,
}

impl PrimaryShared {
    /// Writes what waits in the pipe, or nothing if it is empty; the
    /// bytes are counted as sent.
    fn write_pending(&self, max: usize) -> std::io::Result<usize> {
        let mut out = self.out.lock().unwrap();
        let chunk = self.pipe.try_take(max);
        if !chunk.is_empty() {
            out.write_all(&chunk)?;
            self.sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
        Ok(chunk.len())
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
    /// The bytes of a message that has not all come yet.
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
                    return Err(self.at_end());
                }
                Ok(Some(n)) => self.partial.extend_from_slice(&self.chunk[..n]),
                Ok(None) => return self.apply(shared, events),
                Err(e) => return Err(Failure::Closed(e.to_string())),
            }
        }
    }

    fn apply(&mut self, shared: &PrimaryShared, events: &dyn Fn(PrimaryEvent)) -> Result<(), Failure> {
        let mut at = 0;
        while let Some(&kind) = self.partial.get(at) {
            let msg = &self.partial[at..];
            match kind {
                ACK if msg.len() >= ACK_LEN => {
                    let received = u64::from_le_bytes(msg[1..9].try_into().unwrap());
                    let icount = u64::from_le_bytes(msg[9..17].try_into().unwrap());
                    let now = shared.clock.now_us();
                    shared.last_ack_us.store(now, Ordering::Relaxed);
                    shared.backup_icount.fetch_max(icount, Ordering::Relaxed);
                    shared.backup_report_us.store(now, Ordering::Release);
                    if received > shared.acked.fetch_max(received, Ordering::Relaxed) {
                        shared.signal_ack_waiters();
                        events(PrimaryEvent::Acked);
                    }
                    at += ACK_LEN;
                }
                REQUEST if msg.len() >= 5 => {
                    let len = u32::from_le_bytes(msg[1..5].try_into().unwrap()) as usize;
                    if len > MAX_REQUEST {
                        return Err(Failure::Closed(format!("a request of {len} bytes from the backup")));
                    }
                    if msg.len() < 5 + len {
                        break;
                    }
                    shared.last_ack_us.store(shared.clock.now_us(), Ordering::Relaxed);
                    shared.requests.lock().unwrap().push(msg[5..5 + len].to_vec());
                    at += 5 + len;
                }
                REFUSE if msg.len() >= 3 => {
                    let len = u16::from_le_bytes([msg[1], msg[2]]) as usize;
                    if msg.len() < 3 + len {
                        break;
                    }
                    return Err(Failure::Refused(String::from_utf8_lossy(&msg[3..3 + len]).into_owned()));
                }
                ACK | REQUEST | REFUSE => break,
                other => return Err(Failure::Closed(format!("unknown message kind {other} from the backup"))),
            }
        }
        self.partial.drain(..at);
        Ok(())
    }

    /// What the end of the stream means: a refusal cut short is still one.
    fn at_end(&self) -> Failure {
        match self.partial.first() {
            Some(&REFUSE) => {
                Failure::Refused(String::from_utf8_lossy(self.partial.get(3..).unwrap_or(&[])).into_owned())
            }
            Some(_) => Failure::Closed("end of stream inside a message".into()),
            None => Failure::Closed("end of stream".into()),
        }
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
    shared: Arc<PrimaryShared>,
    stream: TcpStream,
    peer: SocketAddr,
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
/// How long [`LogSender::wait_acked`] reads acknowledgements itself, and
/// the backup's VM reads the log itself when it has none, before they
/// sleep: about a round trip on a loaded host.
const SPIN_FOR: Duration = Duration::from_micros(200);
/// How long after a wait for an acknowledgement (or, on the backup, for
/// log) its caller is counted on to read the next one itself (see
/// [`WaiterTurn`]): the epoch ends of the original epoch protocol come a
/// few microseconds of guest work apart.
const WAITER_GRACE: Duration = Duration::from_millis(1);
/// Bytes that make the sender thread be woken at once.
const SEND_BATCH: u64 = 64 << 10;

impl LogSender {
    /// The primary's end over a connected stream.
    pub fn over(
        stream: TcpStream,
        buffer: usize,
        timing: Timing,
        heartbeat: Option<Heartbeat>,
        events: impl Fn(PrimaryEvent) + Send + Sync + 'static,
    ) -> Result<LogSender, String> {
        let peer = stream.peer_addr().map_err(|e| format!("logging channel: {e}"))?;
        // Outputs wait for acknowledgements: no Nagle delay on either side.
        stream.set_nodelay(true).map_err(|e| format!("logging channel: {e}"))?;
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
            acks_turn: WaiterTurn::default(),
            acks: Mutex::new(AckStream {
                input: stream.try_clone().map_err(|e| format!("logging channel: {e}"))?,
                partial: Vec::new(),
                chunk: vec![0u8; 4096].into_boxed_slice(),
            }),
            out: Mutex::new(stream.try_clone().map_err(|e| format!("logging channel: {e}"))?),
        });
        let events: Arc<dyn Fn(PrimaryEvent) + Send + Sync> = Arc::new(events);
        let fail = {
            let (shared, events) = (shared.clone(), events.clone());
            let socket = stream.try_clone().map_err(|e| format!("logging channel: {e}"))?;
            move |f: Failure| {
                declare(&shared.failed, &shared.pipe, f, |f| events(PrimaryEvent::BackupLost(f)));
                // A write blocked on a backup that stopped reading (the
                // sender thread's, or a waiting caller's) returns now.
                let _ = socket.shutdown(Shutdown::Both);
                shared.signal_ack_waiters();
            }
        };
        let fail = Arc::new(fail);
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name.into()).spawn(f).map(|_| ()).map_err(|e| format!("{name}: {e}"))
        };
        {
            let (shared, fail) = (shared.clone(), fail.clone());
            spawn(
                "ft-log-send",
                Box::new(move || {
                    while shared.pipe.wait_readable() {
                        // A waiting caller may have written them meanwhile.
                        if let Err(e) = shared.write_pending(1 << 20) {
                            return fail(Failure::Closed(e.to_string()));
                        }
                    }
                }),
            )?;
        }
        {
            let (shared, fail, events) = (shared.clone(), fail.clone(), events.clone());
            let input = stream.try_clone().map_err(|e| format!("logging channel: {e}"))?;
            spawn(
                "ft-ack-read",
                Box::new(move || loop {
                    if shared.acks_turn.thread_keeps_off() {
                        continue;
                    }
                    if let Err(e) = poll::wait_readable(&input, Duration::from_secs(1)) {
                        return fail(Failure::Closed(e.to_string()));
                    }
                    let pumped = shared.acks.lock().unwrap().pump(&shared, &*events);
                    if let Err(f) = pumped {
                        return fail(f);
                    }
                }),
            )?;
        }
        {
            let (shared, fail) = (shared.clone(), fail.clone());
            spawn(
                "ft-detect",
                Box::new(move || {
                    let heartbeat = Mutex::new(heartbeat);
                    watch(
                        timing,
                        &heartbeat,
                        &shared.stop,
                        &shared.failed,
                        || shared.clock.since(shared.last_ack_us.load(Ordering::Relaxed)),
                        |f| fail(f),
                    )
                }),
            )?;
        }
        Ok(LogSender { shared, stream, peer, unsent_since: std::cell::Cell::new(None), fail, events })
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// A handle for other threads to follow this channel with.
    pub fn watch(&self) -> SenderWatch {
        SenderWatch { shared: self.shared.clone(), peer: self.peer }
    }

    /// Bytes of log the backup has acknowledged receiving.
    pub fn acked(&self) -> u64 {
        self.shared.acked.load(Ordering::Relaxed)
    }

    /// Bytes handed to the network so far.
    pub fn sent(&self) -> u64 {
        self.shared.sent.load(Ordering::Relaxed)
    }

    /// Bytes of log written into the channel so far.
    pub fn written(&self) -> u64 {
        self.shared.written.load(Ordering::Relaxed)
    }

    /// Bytes waiting in the primary's buffer.
    pub fn buffered(&self) -> usize {
        self.shared.pipe.len()
    }

    /// The instruction count the backup last reported executing.
    pub fn backup_icount(&self) -> u64 {
        self.shared.backup_icount.load(Ordering::Relaxed)
    }

    /// The instruction count the backup last reported executing, and how
    /// long ago that report came. Between reports the backup runs on, so
    /// its lag is best measured as of the report, not as of now.
    pub fn backup_report(&self) -> (u64, Duration) {
        // The time is stored after the count: a report landing between
        // these loads can only make one sample's age short, never long.
        let at = self.shared.backup_report_us.load(Ordering::Acquire);
        (self.backup_icount(), self.shared.clock.since(at))
    }

    /// Why the backup was declared failed, once it has been.
    pub fn failure(&self) -> Option<Failure> {
        self.shared.failed.lock().unwrap().clone()
    }

    /// What the backup asked before it acknowledged anything
    /// ([`LogReceiver::request`]), oldest first. Every request it made
    /// before it became ready is here once its first acknowledgement is.
    pub fn take_requests(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut *self.shared.requests.lock().unwrap())
    }

    /// Stops sending and lets the backup's end see the stream end.
    pub fn close(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.pipe.close();
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
        if let Err(e) = self.shared.write_pending(usize::MAX) {
            (self.fail)(Failure::Closed(e.to_string()));
        }
        let deadline = Instant::now() + wait;
        // The acknowledgement of a short log comes within a round trip: we
        // read it ourselves as it comes rather than sleep and have the
        // reader thread woken for it and wake us in turn, two wake-ups
        // that cost more than the network here (see `poll`).
        let spin_until = Instant::now() + SPIN_FOR;
        let turn = &self.shared.acks_turn;
        turn.begin();
        while self.acked() < total && self.failure().is_none() && Instant::now() < spin_until {
            if let Ok(mut acks) = self.shared.acks.try_lock() {
                if let Err(f) = acks.pump(&self.shared, &*self.events) {
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
        let (lock, signal) = &self.shared.ack_signal;
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
}

impl LogSender {
    /// Has everything written so far sent now.
    pub fn send_now(&self) {
        if self.unsent_since.take().is_some() {
            self.shared.pipe.wake_reader();
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
        self.shared.pipe.put(buf, wake);
        if wake {
            self.unsent_since.set(None);
        }
        self.shared.written.fetch_add(buf.len() as u64, Ordering::Relaxed);
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

/// Records the first failure and tells whoever listens, once.
fn declare(failed: &Mutex<Option<Failure>>, pipe: &Pipe, f: Failure, tell: impl FnOnce(Failure)) {
    {
        let mut slot = failed.lock().unwrap();
        if slot.is_some() {
            return;
        }
        *slot = Some(f.clone());
    }
    pipe.close();
    tell(f);
}

/// The failure detector's loop: watches the peer's channel traffic and
/// heartbeats until one is silent for the timeout or the end is stopped.
fn watch(
    timing: Timing,
    heartbeat: &Mutex<Option<Heartbeat>>,
    stop: &AtomicBool,
    failed: &Mutex<Option<Failure>>,
    channel_silence: impl Fn() -> Duration,
    fail: impl Fn(Failure),
) {
    let tick = (timing.interval / 2).max(Duration::from_millis(1));
    loop {
        std::thread::sleep(tick);
        if stop.load(Ordering::Relaxed) || failed.lock().unwrap().is_some() {
            return;
        }
        let quiet = channel_silence();
        if quiet > timing.timeout {
            return fail(Failure::ChannelSilent(quiet));
        }
        if let Some(hb) = &*heartbeat.lock().unwrap() {
            let quiet = hb.silence();
            if quiet > timing.timeout {
                return fail(Failure::HeartbeatSilent(quiet));
            }
        }
    }
}

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
}

/// The backup's end: receives the log, acknowledges it, detects failure.
pub struct LogReceiver {
    shared: Arc<BackupShared>,
    peer: SocketAddr,
    stream: TcpStream,
}

impl LogReceiver {
    /// Waits for the primary to connect on `listener` (one connection).
    pub fn accept(listener: &TcpListener, buffer: usize) -> Result<LogReceiver, String> {
        let (stream, peer) = listener.accept().map_err(|e| format!("logging channel: {e}"))?;
        stream.set_nodelay(true).map_err(|e| format!("logging channel: {e}"))?;
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
        });
        Ok(LogReceiver { shared, peer, stream })
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Starts receiving: acknowledgements every read and every
    /// `timing.interval`; `on_failure` hears once when the primary is
    /// declared failed. The log stays readable through [`LogPipe`] to its
    /// last byte received until [`LogReceiver::end_log`].
    pub fn start(&self, timing: Timing, on_failure: impl Fn(Failure) + Send + Sync + 'static) -> Result<(), String> {
        let on_failure = Arc::new(on_failure);
        let fail = {
            let (shared, on_failure) = (self.shared.clone(), on_failure.clone());
            Arc::new(move |f: Failure| {
                let mut slot = shared.failed.lock().unwrap();
                if slot.is_none() {
                    *slot = Some(f.clone());
                    drop(slot);
                    on_failure(f);
                }
            })
        };
        let clone = || self.stream.try_clone().map_err(|e| format!("logging channel: {e}"));
        let readable = clone()?;
        *self.shared.receipt.lock().unwrap() = Some(Receipt {
            input: clone()?,
            out: clone()?,
            timing,
            buf: vec![0u8; 1 << 16],
            last_ack: Instant::now(),
            acked: (u64::MAX, u64::MAX),
            delayed: VecDeque::new(),
            released: 0,
            end: None,
        });
        {
            let (shared, fail) = (self.shared.clone(), fail.clone());
            let thread = std::thread::Builder::new()
                .name("ft-log-receive".into())
                .spawn(move || receive(&shared, &readable, timing, &*fail))
                .map_err(|e| format!("ft-log-receive: {e}"))?;
            self.shared.log_turn.set_thread(thread.thread().clone());
        }
        {
            let shared = self.shared.clone();
            std::thread::Builder::new()
                .name("ft-detect".into())
                .spawn(move || {
                    let silence = || shared.clock.since(shared.last_heard_us.load(Ordering::Relaxed));
                    watch(timing, &shared.heartbeat, &shared.stop, &shared.failed, silence, |f| fail(f))
                })
                .map_err(|e| format!("ft-detect: {e}"))?;
        }
        Ok(())
    }

    /// Watches the primary's heartbeats too, from now on (they can start
    /// only once the log's header named the pair's generation).
    pub fn add_heartbeat(&self, heartbeat: Heartbeat) {
        *self.shared.heartbeat.lock().unwrap() = Some(heartbeat);
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
    pub fn request(&self, request: Vec<u8>) -> Result<(), String> {
        if request.len() > MAX_REQUEST {
            return Err(format!("a request of {} bytes to the primary (at most {MAX_REQUEST})", request.len()));
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

/// The backup's reading of the socket: the log into the pipe, and the
/// acknowledgements back. One at a time: the receiving thread, or the
/// replaying VM's thread while it waits for log.
struct Receipt {
    input: TcpStream,
    out: TcpStream,
    timing: Timing,
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
    /// Takes what has come, up to `room` bytes, into the pipe without
    /// waiting; how many (0 when nothing had).
    fn take_arrived(&mut self, shared: &BackupShared, room: usize) -> Result<usize, Stop> {
        let room = room.min(self.buf.len());
        if room == 0 {
            return Ok(0);
        }
        match poll::try_read(&self.input, &mut self.buf[..room]) {
            Ok(None) => Ok(0),
            Ok(Some(0)) => Err(Stop::Failed(Failure::Closed("end of stream".into()))),
            Ok(Some(n)) => {
                shared.last_heard_us.store(shared.clock.now_us(), Ordering::Relaxed);
                if !shared.pipe.put(&self.buf[..n], false) {
                    return Err(Stop::Closed);
                }
                shared.received.fetch_add(n as u64, Ordering::Relaxed);
                Ok(n)
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
            let mut msg = vec![REQUEST];
            msg.extend((request.len() as u32).to_le_bytes());
            msg.extend(request);
            self.out.write_all(&msg).map_err(|e| Failure::Closed(e.to_string()))?;
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
        if now.0 != self.acked.0 || self.last_ack.elapsed() >= self.timing.interval {
            let mut msg = [0u8; ACK_LEN];
            msg[0] = ACK;
            msg[1..9].copy_from_slice(&now.0.to_le_bytes());
            msg[9..17].copy_from_slice(&now.1.to_le_bytes());
            self.out.write_all(&msg).map_err(|e| Failure::Closed(e.to_string()))?;
            self.acked = now;
            self.last_ack = Instant::now();
        }
        Ok(())
    }

    fn refuse(&mut self, why: &str) {
        let text = &why.as_bytes()[..why.len().min(u16::MAX as usize)];
        let mut msg = vec![REFUSE];
        msg.extend((text.len() as u16).to_le_bytes());
        msg.extend(text);
        let _ = self.out.write_all(&msg);
        let _ = self.out.shutdown(Shutdown::Write);
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
        // Held by the receiving thread: it is taking the bytes for us.
        let Ok(mut guard) = self.receipt.try_lock() else { return true };
        let Some(rx) = guard.as_mut() else { return false };
        if rx.end.is_some() || self.stop.load(Ordering::Relaxed) {
            return false;
        }
        // Only the reader makes room: it must not wait for any.
        let ended = match rx.take_arrived(self, self.pipe.free()) {
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
fn receive(shared: &BackupShared, readable: &TcpStream, timing: Timing, fail: &dyn Fn(Failure)) {
    loop {
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
        let got = match rx.take_arrived(shared, room) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn pair(
        buffer: usize,
        timing: Timing,
    ) -> (LogSender, mpsc::Receiver<PrimaryEvent>, LogReceiver, mpsc::Receiver<Failure>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let acc = std::thread::spawn(move || LogReceiver::accept(&listener, buffer).unwrap());
        let (ptx, prx) = mpsc::channel();
        let ptx = Mutex::new(ptx);
        let stream = connect(addr, Duration::from_secs(5)).unwrap();
        let sender = LogSender::over(stream, DEFAULT_BUFFER, timing, None, move |e| {
            let _ = ptx.lock().unwrap().send(e);
        })
        .unwrap();
        let receiver = acc.join().unwrap();
        let (btx, brx) = mpsc::channel();
        let btx = Mutex::new(btx);
        receiver
            .start(timing, move |f| {
                let _ = btx.lock().unwrap().send(f);
            })
            .unwrap();
        (sender, prx, receiver, brx)
    }

    #[test]
    fn small_writes_wait_to_be_batched_until_sent_now_or_due() {
        let (mut s, _prx, r, _brx) = pair(1 << 20, Timing::DEFAULT);
        // The sender thread parks first (until then it takes what it finds).
        std::thread::sleep(Duration::from_millis(50));
        s.write_all(b"frame-1").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        // Nothing asked for it and nothing followed: it waits.
        assert_eq!(s.sent(), 0);
        s.send_now();
        let mut got = [0u8; 7];
        r.pipe().read_exact(&mut got).unwrap();
        assert_eq!(&got, b"frame-1");
        // Due after the delay: the next look sends it.
        s.write_all(b"frame-2").unwrap();
        std::thread::sleep(SEND_DELAY * 2);
        s.send_if_due();
        r.pipe().read_exact(&mut got).unwrap();
        assert_eq!(&got, b"frame-2");
        // A large batch goes by itself.
        s.write_all(&vec![7u8; SEND_BATCH as usize]).unwrap();
        let mut big = vec![0u8; SEND_BATCH as usize];
        r.pipe().read_exact(&mut big).unwrap();
    }

    #[test]
    fn bytes_arrive_in_order_and_are_acknowledged_on_receipt() {
        let (mut s, prx, r, _brx) = pair(1 << 20, Timing::DEFAULT);
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        s.write_all(&data).unwrap();
        // Acknowledged without the VM having read anything.
        assert!(s.wait_acked(data.len() as u64, Duration::from_secs(5)));
        assert!(matches!(prx.recv_timeout(Duration::from_secs(1)), Ok(PrimaryEvent::Acked)));
        let mut got = vec![0u8; data.len()];
        r.pipe().read_exact(&mut got).unwrap();
        assert_eq!(got, data);
        r.set_executed(12345);
        let t0 = Instant::now();
        while s.backup_icount() != 12345 {
            assert!(t0.elapsed() < Duration::from_secs(2), "execution progress never reported");
            std::thread::sleep(Duration::from_millis(5));
        }
        // The report's age is how long ago it came: after the count was set.
        let (icount, age) = s.backup_report();
        assert_eq!(icount, 12345);
        assert!(age <= t0.elapsed(), "{age:?}");
    }

    #[test]
    fn delayed_acknowledgements_arrive_no_sooner_and_the_primary_waits_without_failing() {
        let (mut s, prx, r, _brx) = pair(1 << 20, Timing::DEFAULT);
        let delay = Duration::from_millis(700);
        r.delay_acks(delay);
        std::thread::sleep(Duration::from_millis(100));
        let t0 = Instant::now();
        s.write_all(b"entry").unwrap();
        assert!(s.wait_acked(5, Duration::from_secs(5)));
        let waited = t0.elapsed();
        assert!(waited >= delay && waited < delay * 2, "acknowledged after {waited:?}");
        // Longer than the timeout, yet no failure: the periodic
        // acknowledgements kept coming.
        assert!(delay > Timing::DEFAULT.timeout);
        assert!(s.failure().is_none());
        assert!(prx.try_iter().all(|e| matches!(e, PrimaryEvent::Acked)));
    }

    #[test]
    fn a_backup_acknowledges_nothing_until_ready_and_can_refuse_with_its_reason() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let acc = std::thread::spawn(move || LogReceiver::accept(&listener, 1 << 20).unwrap());
        let (ptx, prx) = mpsc::channel();
        let ptx = Mutex::new(ptx);
        let stream = connect(addr, Duration::from_secs(5)).unwrap();
        let mut s = LogSender::over(stream, DEFAULT_BUFFER, Timing::DEFAULT, None, move |e| {
            let _ = ptx.lock().unwrap().send(e);
        })
        .unwrap();
        let r = acc.join().unwrap();
        r.hold_acks();
        r.start(Timing::DEFAULT, |_| {}).unwrap();
        s.write_all(b"header").unwrap();
        // Alive (no failure for longer than the timeout), but nothing acknowledged.
        std::thread::sleep(Timing::DEFAULT.timeout * 2);
        assert_eq!(s.acked(), 0);
        assert!(s.failure().is_none());
        r.refuse("its disk differs");
        match prx.recv_timeout(Duration::from_secs(5)) {
            Ok(PrimaryEvent::BackupLost(Failure::Refused(why))) => assert_eq!(why, "its disk differs"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn requests_made_before_ready_arrive_ahead_of_the_first_acknowledgement() {
        for _ in 0..20 {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let acc = std::thread::spawn(move || LogReceiver::accept(&listener, 1 << 20).unwrap());
            let stream = connect(addr, Duration::from_secs(5)).unwrap();
            let mut s = LogSender::over(stream, DEFAULT_BUFFER, Timing::DEFAULT, None, |_| {}).unwrap();
            let r = acc.join().unwrap();
            r.hold_acks();
            r.start(Timing::DEFAULT, |_| {}).unwrap();
            s.write_all(b"header").unwrap();
            s.send_now();
            assert!(s.take_requests().is_empty());
            r.request(b"first".to_vec()).unwrap();
            r.request(vec![7u8; 100_000]).unwrap();
            assert!(r.request(vec![0u8; MAX_REQUEST + 1]).is_err());
            r.ready();
            assert!(s.wait_acked(6, Duration::from_secs(5)));
            assert_eq!(s.take_requests(), vec![b"first".to_vec(), vec![7u8; 100_000]]);
            assert!(s.take_requests().is_empty());
            assert!(s.failure().is_none());
        }
    }

    #[test]
    fn full_buffers_stall_the_primary() {
        // 64 KiB at the backup, nobody consuming: the primary's own 64 KiB
        // buffer fills behind the socket buffers, and writes block.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let acc = std::thread::spawn(move || LogReceiver::accept(&listener, 64 << 10).unwrap());
        let stream = TcpStream::connect(addr).unwrap();
        let mut s = LogSender::over(stream, 64 << 10, Timing::DEFAULT, None, |_| {}).unwrap();
        let r = acc.join().unwrap();
        r.start(Timing::DEFAULT, |_| {}).unwrap();
        let written = Arc::new(AtomicU64::new(0));
        let w = written.clone();
        std::thread::spawn(move || {
            let chunk = vec![1u8; 4096];
            loop {
                s.write_all(&chunk).unwrap();
                w.fetch_add(4096, Ordering::Relaxed);
            }
        });
        std::thread::sleep(Duration::from_millis(500));
        let stalled_at = written.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(written.load(Ordering::Relaxed), stalled_at, "the primary kept writing");
        // Consuming at the backup lets it go on.
        let mut pipe = r.pipe();
        let mut sink = vec![0u8; 1 << 20];
        for _ in 0..64 {
            let _ = pipe.read(&mut sink).unwrap();
        }
        std::thread::sleep(Duration::from_millis(300));
        assert!(written.load(Ordering::Relaxed) > stalled_at);
    }

    #[test]
    fn a_closed_primary_is_a_failure_and_the_log_drains() {
        let (mut s, _prx, r, brx) = pair(1 << 20, Timing::DEFAULT);
        s.write_all(b"last words").unwrap();
        assert!(s.wait_acked(10, Duration::from_secs(5)));
        drop(s);
        let f = brx.recv_timeout(Duration::from_secs(2)).expect("failure declared");
        assert!(matches!(f, Failure::Closed(_)), "{f:?}");
        r.end_log();
        let mut all = Vec::new();
        r.pipe().read_to_end(&mut all).unwrap();
        assert_eq!(all, b"last words");
    }

    #[test]
    fn after_a_close_the_log_is_consumed_once_the_reader_has_read_it_all() {
        let (mut s, _prx, r, brx) = pair(1 << 20, Timing::DEFAULT);
        let r = Arc::new(r);
        s.write_all(b"0123456789").unwrap();
        assert!(s.wait_acked(10, Duration::from_secs(5)));
        drop(s);
        brx.recv_timeout(Duration::from_secs(2)).expect("failure declared");
        r.stop_receiving();
        let waiter = {
            let r = r.clone();
            std::thread::spawn(move || r.wait_consumed())
        };
        // Ten bytes are still to be read: whoever waits, waits.
        std::thread::sleep(Duration::from_millis(100));
        assert!(!waiter.is_finished());
        let mut pipe = r.pipe();
        let mut buf = [0u8; 10];
        pipe.read_exact(&mut buf).unwrap();
        // The reader now waits for more, which is what the waiter hears.
        let reader = std::thread::spawn(move || pipe.read(&mut [0u8; 1]).unwrap());
        assert!(waiter.join().unwrap(), "the reader is still reading");
        r.end_log();
        assert_eq!(reader.join().unwrap(), 0);
        // A reader that says it is done answers at once.
        r.reading_done();
        assert!(!r.wait_consumed());
    }

    #[test]
    fn silence_is_a_failure_after_the_timeout() {
        let timing = Timing { timeout: Duration::from_millis(200), interval: Duration::from_millis(20) };
        let (_s, _prx, r, brx) = pair(1 << 20, timing);
        // The primary writes nothing (no keep-alives): the backup gives up.
        let t0 = Instant::now();
        let f = brx.recv_timeout(Duration::from_secs(3)).expect("failure declared");
        assert!(matches!(f, Failure::ChannelSilent(_)), "{f:?}");
        assert!(t0.elapsed() >= Duration::from_millis(150));
        assert!(r.failure().is_some());
    }

    #[test]
    fn a_silent_backup_is_a_failure_for_the_primary() {
        let timing = Timing { timeout: Duration::from_millis(200), interval: Duration::from_millis(20) };
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // Accepts and never acknowledges.
        let _held = std::thread::spawn(move || {
            let c = listener.accept().unwrap();
            std::thread::sleep(Duration::from_secs(3));
            drop(c);
        });
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let stream = connect(addr, Duration::from_secs(5)).unwrap();
        let _s = LogSender::over(stream, DEFAULT_BUFFER, timing, None, move |e| {
            let _ = tx.lock().unwrap().send(e);
        })
        .unwrap();
        match rx.recv_timeout(Duration::from_secs(2)).unwrap() {
            PrimaryEvent::BackupLost(Failure::ChannelSilent(_)) => {}
            other => panic!("{other:?}"),
        }
    }
}
