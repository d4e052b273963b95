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
//! channel's ends read without blocking while someone waits on a round
//! trip (the waiter itself, or a thread polling for it, yielding its core
//! between tries), and sleep otherwise: polling costs a core's spare time,
//! and only while a wait is on.

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Whether the reader of a socket polls: open while another thread waits
/// for what it reads. Only while: a polling thread that yields to a busy
/// one sharing its core runs again only at the scheduler's next tick,
/// while one asleep in `read()` is woken, and preempts, as soon as bytes
/// come.
#[derive(Clone, Default)]
pub struct PollWindow(Arc<AtomicBool>);

impl PollWindow {
    pub fn open(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn close(&self) {
        self.0.store(false, Ordering::Relaxed);
    }

    pub fn is_open(&self) -> bool {
        self.0.load(Ordering::Relaxed)
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
        match try_read(stream, buf)? {
            Some(n) => return Ok(n),
            None => std::thread::yield_now(),
        }
    }
}

/// Reads what has come, without waiting: `None` if nothing has.
pub fn try_read(stream: &TcpStream, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
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
        let window = PollWindow::default();
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
        assert_eq!(try_read(&server, &mut buf).unwrap(), Some(0));
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
}
