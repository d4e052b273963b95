//! Reading a socket by polling it while a round trip is awaited.
//!
//! Why: where an idle core halts and waking it goes through the
//! hypervisor (a VM host without posted interrupts, as this one), waking a
//! thread asleep in `read()` costs far more than the network does. A TCP
//! round trip over loopback, 40 bytes there and 17 back (a log frame and
//! its acknowledgement), between processes pinned to the two cores, the
//! sender waiting on a reader thread as the primary does: 99-124 us with
//! both ends asleep in `read()`, 90 us with one end polling, 14 us with
//! both (20 000 round trips each, a throwaway C program). So whoever
//! waits on a round trip reads the socket itself, without blocking, in a
//! loop ([`try_read`]), and the channel's threads sleep on the socket
//! ([`wait_readable`]) otherwise: polling costs a core's spare time, and
//! only while a wait is on.

use std::io::ErrorKind;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long a waiter may hold a [`WaiterTurn`] before the thread takes
/// the socket back: many times the waits it is for (a round trip, spun
/// on for [`crate::channel`]'s 200 µs), far below any failure timeout.
pub const OVERDUE: Duration = Duration::from_millis(5);

/// Whose turn it is to read a socket that a channel's thread reads
/// otherwise: a caller waiting on a round trip reads it itself, and the
/// thread keeps off meanwhile, and for a grace after (the next wait of a
/// run of them, an epoch end, is as near). Asleep on the socket, the
/// thread would be woken for every message through a cross-core
/// interrupt, or switched to on the waiter's own core, which costs more
/// than the round trip itself.
pub struct WaiterTurn {
    start: Instant,
    /// Until when (µs since `start`) a waiter holds the socket:
    /// `u64::MAX` while one waits.
    until_us: AtomicU64,
    /// When (µs since `start`) the waiter holding it began.
    begun_us: AtomicU64,
    /// The thread to wake when a waiter gives the socket back at once.
    thread: OnceLock<Thread>,
}

impl Default for WaiterTurn {
    fn default() -> Self {
        WaiterTurn {
            start: Instant::now(),
            until_us: AtomicU64::new(0),
            begun_us: AtomicU64::new(0),
            thread: OnceLock::new(),
        }
    }
}

impl WaiterTurn {
    /// The thread that reads the socket when no waiter does. Unset, it
    /// notices a socket given back within its next look (1 ms).
    pub fn set_thread(&self, thread: Thread) {
        let _ = self.thread.set(thread);
    }

    /// A caller begins to wait: it reads the socket itself from now on.
    pub fn begin(&self) {
        self.begun_us.store(self.start.elapsed().as_micros() as u64, Ordering::Relaxed);
        self.until_us.store(u64::MAX, Ordering::Relaxed);
    }

    /// The waiter is done, and keeps the socket for `grace` more; with
    /// none, the thread takes it back now.
    pub fn end(&self, grace: Duration) {
        if grace.is_zero() {
            self.until_us.store(0, Ordering::Relaxed);
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        } else {
            let now = self.start.elapsed().as_micros() as u64;
            self.until_us.store(now + grace.as_micros() as u64, Ordering::Relaxed);
        }
    }

    /// For the thread: while a waiter holds the socket, sleeps a while
    /// (at most 1 ms) and says so; the thread then looks again. A waiter
    /// that has held it for [`OVERDUE`] was kept off the CPU in its short
    /// wait (a VM's thread on a loaded host): the thread reads again, as
    /// the socket's reads are shared under its owner's lock anyway (issue
    /// 65: a replay preempted in its wait left the log unread and the
    /// acknowledgements unsent for as long as it was off the CPU).
    pub fn thread_keeps_off(&self) -> bool {
        let now = self.start.elapsed().as_micros() as u64;
        let until = self.until_us.load(Ordering::Relaxed);
        if now >= until {
            return false;
        }
        if until == u64::MAX && now.saturating_sub(self.begun_us.load(Ordering::Relaxed)) >= OVERDUE.as_micros() as u64
        {
            return false;
        }
        std::thread::park_timeout(Duration::from_micros((until - now).min(1000)));
        true
    }
}

/// Reads what has come, without waiting: `None` if nothing has.
pub fn try_read(stream: &TcpStream, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
    // Asked first without reading: a read takes the socket's lock even
    // when nothing has come, and a segment arriving meanwhile (on the
    // sender's core, in its softirq) then spins on that lock or is left
    // for us to process later; a caller polling in a loop would hold it
    // much of the time. `poll` looks without the lock.
    let mut fd = libc::pollfd { fd: stream.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one pollfd, valid for the call; a zero timeout never sleeps.
    if unsafe { libc::poll(&mut fd, 1, 0) } == 0 {
        return Ok(None);
    }
    loop {
        // SAFETY: recv writes at most buf.len() bytes into buf, which we
        // borrow mutably for the call; the descriptor is the stream's own.
        let n = unsafe { libc::recv(stream.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            ErrorKind::WouldBlock => return Ok(None),
            ErrorKind::Interrupted => {}
            _ => return Err(e),
        }
    }
}

/// How many bytes have come on `stream` and wait to be read (0 on error).
pub fn unread(stream: &TcpStream) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int, which we own, for the call.
    if unsafe { libc::ioctl(stream.as_raw_fd(), libc::FIONREAD, &mut n) } < 0 {
        return 0;
    }
    n.max(0) as usize
}

/// Sleeps until `stream` has something to read (or its end, or an error),
/// or for `timeout`.
pub fn wait_readable(stream: &TcpStream, timeout: Duration) -> std::io::Result<()> {
    let mut fd = libc::pollfd { fd: stream.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    loop {
        // SAFETY: one pollfd, valid for the call.
        if unsafe { libc::poll(&mut fd, 1, ms) } >= 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Whether `stream` has something to read (or its end, or an error)
/// within `timeout`: false if it stayed silent throughout.
pub fn readable_within(stream: &TcpStream, timeout: Duration) -> std::io::Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut fd = libc::pollfd { fd: stream.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one pollfd, valid for the call.
        match unsafe { libc::poll(&mut fd, 1, ms) } {
            n if n > 0 => return Ok(true),
            0 if Instant::now() >= deadline => return Ok(false),
            0 => {}
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    /// A waiter that began and never ended (kept off the CPU) holds the
    /// socket for [`OVERDUE`] at most; one that ended with a grace holds
    /// it for the grace. Each look is judged by the time before the step
    /// it follows, so the test itself kept off the CPU between the two
    /// (a loaded host: CI saw it) proves nothing wrong.
    #[test]
    fn a_waiter_kept_off_the_cpu_gives_the_socket_back_when_overdue() {
        let turn = WaiterTurn::default();
        let t0 = Instant::now();
        turn.begin();
        assert!(turn.thread_keeps_off() || t0.elapsed() >= OVERDUE, "a waiter just began");
        while turn.thread_keeps_off() {
            assert!(t0.elapsed() < OVERDUE * 20, "the waiter kept the socket");
        }
        assert!(t0.elapsed() >= OVERDUE / 2, "the socket given back {:?} after the waiter began", t0.elapsed());
        let t1 = Instant::now();
        turn.end(Duration::from_millis(50));
        assert!(turn.thread_keeps_off() || t1.elapsed() >= Duration::from_millis(50), "the grace holds");
        turn.end(Duration::ZERO);
        assert!(!turn.thread_keeps_off());
    }

    #[test]
    fn try_read_says_when_nothing_has_come() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(try_read(&server, &mut buf).unwrap(), None);
        client.write_all(b"ack").unwrap();
        wait_readable(&server, Duration::from_secs(5)).unwrap();
        assert_eq!(try_read(&server, &mut buf).unwrap(), Some(3));
    }

    #[test]
    fn try_read_sees_the_end_of_the_stream() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let mut buf = [0u8; 8];
        client.write_all(b"last").unwrap();
        drop(client);
        wait_readable(&server, Duration::from_secs(5)).unwrap();
        assert_eq!(try_read(&server, &mut buf).unwrap(), Some(4));
        assert_eq!(try_read(&server, &mut buf).unwrap(), Some(0), "the end, not nothing yet");
    }
}
