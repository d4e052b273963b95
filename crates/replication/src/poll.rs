//! Reading a socket by polling it while a round trip is awaited.
//!
//! Why: where an idle core halts and waking it goes through the
//! hypervisor (a VM host without posted interrupts, as this one), waking a
//! thread asleep in `read()` costs far more than the network does. A TCP
//! round trip over loopback, 40 bytes there and 17 back (a log frame and
//! its acknowledgement), between processes pinned to the two cores, the
//! sender waiting on a reader thread as the primary does: 99-124 us with
//! both ends asleep in `read()`, 90 us with one end polling, 14 us with
//! both (20 000 round trips each, a throwaway C program). So the
//! channel's reading threads poll without blocking, yielding their core
//! between tries, while someone waits on a round trip, and sleep in
//! `read()` otherwise: polling costs a core's spare time, and only while
//! a wait is on.

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Until when the reader of a socket polls, shared between the threads
/// that wait on a round trip and the one that reads its answer.
#[derive(Clone)]
pub struct PollWindow {
    epoch: Instant,
    /// Microseconds since `epoch`; `u64::MAX` while a wait is on.
    until_us: Arc<AtomicU64>,
    /// How long the reader keeps polling after a wait ended.
    grace_us: u64,
}

impl PollWindow {
    /// A window that stays open `grace` after each wait. A grace bridges a
    /// run of waits (the epoch ends of the original epoch protocol come
    /// every few microseconds of guest work) where the waiter's core has
    /// time to spare; where it has not (a thread that shares its core with
    /// a busy one), none: a polling thread that yields to a busy one runs
    /// again only at the scheduler's next tick, while one asleep in
    /// `read()` is woken, and preempts, as soon as bytes come.
    pub fn new(grace: Duration) -> PollWindow {
        PollWindow { epoch: Instant::now(), until_us: Arc::new(AtomicU64::new(0)), grace_us: grace.as_micros() as u64 }
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// A wait starts: poll until it ends.
    pub fn open(&self) {
        self.until_us.store(u64::MAX, Ordering::Relaxed);
    }

    /// The wait ended: poll a little longer, for the next one.
    pub fn close(&self) {
        self.until_us.store(self.now_us() + self.grace_us, Ordering::Relaxed);
    }

    pub fn is_open(&self) -> bool {
        let until = self.until_us.load(Ordering::Relaxed);
        until == u64::MAX || self.now_us() < until
    }
}

/// Reads `stream` as `Read` does, but without sleeping while `window` is
/// open. A read that began asleep stays so until bytes come (or the
/// socket's read timeout).
pub fn read(stream: &TcpStream, buf: &mut [u8], window: &PollWindow) -> std::io::Result<usize> {
    loop {
        if !window.is_open() {
            return (&*stream).read(buf);
        }
        // SAFETY: recv writes at most buf.len() bytes into buf, which we
        // borrow mutably for the call; the descriptor is the stream's own.
        let n = unsafe { libc::recv(stream.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            ErrorKind::WouldBlock => std::thread::yield_now(),
            ErrorKind::Interrupted => {}
            _ => return Err(e),
        }
    }
}

/// A stream read through [`read`], for a `BufReader`.
pub struct PollingReader {
    pub stream: TcpStream,
    pub window: PollWindow,
}

impl Read for PollingReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        read(&self.stream, buf, &self.window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    #[test]
    fn reads_the_same_bytes_polling_or_asleep_and_sees_the_end() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let grace = Duration::from_millis(1);
        let window = PollWindow::new(grace);
        let mut buf = [0u8; 8];
        client.write_all(b"asleep").unwrap();
        assert!(!window.is_open());
        assert_eq!(read(&server, &mut buf, &window).unwrap(), 6);
        window.open();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            client.write_all(b"polled").unwrap();
            client
        });
        assert_eq!(read(&server, &mut buf, &window).unwrap(), 6);
        assert_eq!(&buf[..6], b"polled");
        drop(writer.join().unwrap());
        assert_eq!(read(&server, &mut buf, &window).unwrap(), 0, "the end of the stream");
        window.close();
        assert!(window.is_open(), "open a little after the wait");
        std::thread::sleep(2 * grace);
        assert!(!window.is_open());
    }
}
