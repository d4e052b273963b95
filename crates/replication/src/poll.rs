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
use std::time::Duration;

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
