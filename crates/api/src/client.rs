//! The client side of a VM's control socket: one typed request and its
//! response (`send`), a VM's events as they come (`follow_events`), and
//! its console (`attach_console`); and why a socket could not be served
//! or reached ([`ControlSocketError`], the server's errors too, so one
//! type says what went wrong with a socket on either end).

use crate::request::{ControlError, Reply, Request, Response};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why the control socket could not be served or reached.
#[derive(Debug, thiserror::Error)]
pub enum ControlSocketError {
    #[error("control socket {} is in use by another VM", .0.display())]
    InUse(PathBuf),
    #[error("cannot create control socket {}: {source}", .path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot connect to control socket {}: {source}", .path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("control socket {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("control socket {} closed without an answer", .0.display())]
    NoAnswer(PathBuf),
    /// The VM refused the request.
    #[error("the VM answered: error {0}")]
    Refused(ControlError),
    #[error("control socket {}: unreadable answer ({source}): {reply}", .path.display())]
    UnreadableAnswer {
        path: PathBuf,
        reply: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The client side of `ftvm console`: connects, asks to attach (to watch
/// only if `read_only`), and returns the connection, which from then on
/// carries the console's bytes both ways, and whether it types.
pub fn attach_console(path: &Path, read_only: bool) -> Result<(UnixStream, bool), ControlSocketError> {
    attach_console_within(path, read_only, None)
}

/// The same, the VM's answer awaited at most `wait` (a daemon that
/// attaches for a remote client must not hang on a wedged VM); the
/// connection it returns has no deadline.
pub fn attach_console_within(
    path: &Path,
    read_only: bool,
    wait: Option<Duration>,
) -> Result<(UnixStream, bool), ControlSocketError> {
    let e = |source| ControlSocketError::Io { path: path.to_path_buf(), source };
    let mut s = connect(path)?;
    s.set_read_timeout(wait).map_err(e)?;
    s.set_write_timeout(wait).map_err(e)?;
    let request = serde_json::to_string(&Request::Console { read_only }).expect("a request serializes");
    writeln!(s, "{request}").map_err(e)?;
    // The reply line, a byte at a time: the console's bytes follow it.
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match s.read(&mut byte).map_err(e)? {
            0 => return Err(ControlSocketError::NoAnswer(path.to_path_buf())),
            _ if byte[0] == b'\n' => break,
            _ => line.push(byte[0]),
        }
    }
    let text = String::from_utf8_lossy(&line);
    match serde_json::from_str::<Response>(&text) {
        Ok(Response::Ok(Reply::Console { typing })) => {
            s.set_read_timeout(None).map_err(e)?;
            s.set_write_timeout(None).map_err(e)?;
            Ok((s, typing))
        }
        Ok(Response::Error(refusal)) => Err(ControlSocketError::Refused(refusal)),
        Ok(other) => Err(ControlSocketError::Refused(ControlError::BadRequest(format!(
            "an answer that is not the console's: {other}"
        )))),
        Err(source) => {
            Err(ControlSocketError::UnreadableAnswer { path: path.to_path_buf(), reply: text.into_owned(), source })
        }
    }
}

/// The client side of `events`: calls `on_line` with each line that
/// comes, until the VM closes the socket.
pub fn follow_events(path: &Path, json: bool, mut on_line: impl FnMut(&str)) -> Result<(), ControlSocketError> {
    let e = |source| ControlSocketError::Io { path: path.to_path_buf(), source };
    let mut s = connect(path)?;
    let request =
        if json { serde_json::to_string(&Request::Events).expect("a request serializes") } else { "events".into() };
    writeln!(s, "{request}").map_err(e)?;
    for line in BufReader::new(s).lines() {
        on_line(&line.map_err(e)?);
    }
    Ok(())
}

/// The client side (`ftvm control SOCKET COMMAND`): sends one request and
/// returns the response, with the line it came in; gives up after `wait`
/// (a VM that is stopped, or wedged, does not hang its client).
pub fn send(path: &Path, request: &Request, wait: Duration) -> Result<(Response, String), ControlSocketError> {
    let e = |source| ControlSocketError::Io { path: path.to_path_buf(), source };
    let mut s = connect(path)?;
    s.set_read_timeout(Some(wait)).map_err(e)?;
    s.set_write_timeout(Some(wait)).map_err(e)?;
    let line = serde_json::to_string(request).expect("a request serializes");
    // A VM that answers before it reads (a busy socket) may have closed
    // its end by the time we write: its answer is still there to read.
    let wrote = writeln!(s, "{line}");
    let mut reply = String::new();
    let read = BufReader::new(s).read_line(&mut reply);
    if reply.is_empty() {
        wrote.map_err(e)?;
        read.map_err(e)?;
        return Err(ControlSocketError::NoAnswer(path.to_path_buf()));
    }
    let reply = reply.trim_end().to_string();
    match serde_json::from_str(&reply) {
        Ok(response) => Ok((response, reply)),
        Err(source) => Err(ControlSocketError::UnreadableAnswer { path: path.to_path_buf(), reply, source }),
    }
}

fn connect(path: &Path) -> Result<UnixStream, ControlSocketError> {
    UnixStream::connect(path).map_err(|source| ControlSocketError::Connect { path: path.to_path_buf(), source })
}
