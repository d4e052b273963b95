//! The control socket of a running VM (`--control PATH`): a Unix socket
//! taking one command per connection, one line each way. It is how tools
//! and later the replication modes pause, snapshot and resume a VM that is
//! running.
//!
//! Commands: `status`, `pause`, `resume`, `snapshot FILE`, `quit`.
//! Replies start with `ok` or `error`.

use crate::host_io::HostEvent;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Sender};
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Status,
    Pause,
    Resume,
    Snapshot(PathBuf),
    Quit,
}

/// A command on its way to the live loop, with where its answer goes.
pub struct ControlRequest {
    pub command: Command,
    pub reply: Sender<String>,
}

pub fn parse(line: &str) -> Result<Command, String> {
    let line = line.trim();
    let (word, rest) = line.split_once(' ').map_or((line, ""), |(w, r)| (w, r.trim()));
    match (word, rest) {
        ("status", "") => Ok(Command::Status),
        ("pause", "") => Ok(Command::Pause),
        ("resume", "") => Ok(Command::Resume),
        ("quit", "") => Ok(Command::Quit),
        ("snapshot", "") => Err("snapshot needs a file name".into()),
        ("snapshot", path) => Ok(Command::Snapshot(PathBuf::from(path))),
        _ => Err(format!("unknown command '{line}' (status, pause, resume, snapshot FILE, quit)")),
    }
}

/// Removes the socket file when the VM ends.
pub struct ControlSocket {
    path: PathBuf,
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Listens on `path`, forwarding commands to the live loop.
pub fn listen(path: &Path, events: Sender<HostEvent>) -> Result<ControlSocket, String> {
    let events = std::sync::Mutex::new(events);
    serve(path, move |command| {
        let (tx, rx) = mpsc::channel();
        let request = HostEvent::Control(ControlRequest { command, reply: tx });
        if events.lock().unwrap().send(request).is_err() {
            return "error the VM has stopped".to_string();
        }
        rx.recv().unwrap_or_else(|_| "error the VM has stopped".to_string())
    })
}

/// Listens on `path`, answering each command with `answer`. The socket
/// file goes when the returned value is dropped (and with it any way to
/// connect), so another listener may take the path over.
pub fn serve(path: &Path, answer: impl Fn(Command) -> String + Send + Sync + 'static) -> Result<ControlSocket, String> {
    // A socket file left by a VM that was killed would make bind fail; one
    // that still answers belongs to a live VM and must not be taken over.
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(format!("control socket {} is in use by another VM", path.display()));
        }
        let _ = std::fs::remove_file(path);
    }
    let listener =
        UnixListener::bind(path).map_err(|e| format!("cannot create control socket {}: {e}", path.display()))?;
    let answer = std::sync::Arc::new(answer);
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let answer = answer.clone();
            std::thread::spawn(move || serve_one(conn, &*answer));
        }
    });
    Ok(ControlSocket { path: path.to_path_buf() })
}

fn serve_one(conn: UnixStream, answer: &dyn Fn(Command) -> String) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut line = String::new();
    let Ok(mut writer) = conn.try_clone() else { return };
    if BufReader::new(conn).read_line(&mut line).is_err() {
        return;
    }
    let reply = match parse(&line) {
        Err(e) => format!("error {e}"),
        Ok(command) => answer(command),
    };
    let _ = writeln!(writer, "{reply}");
}

/// The client side (`ftvm control SOCKET COMMAND`): sends one command and
/// returns the reply line.
pub fn send(path: &Path, command: &str) -> Result<String, String> {
    let mut s =
        UnixStream::connect(path).map_err(|e| format!("cannot connect to control socket {}: {e}", path.display()))?;
    writeln!(s, "{command}").map_err(|e| format!("control socket {}: {e}", path.display()))?;
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply).map_err(|e| format!("control socket {}: {e}", path.display()))?;
    if reply.is_empty() {
        return Err(format!("control socket {} closed without an answer", path.display()));
    }
    Ok(reply.trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands() {
        assert_eq!(parse("status\n").unwrap(), Command::Status);
        assert_eq!(parse(" snapshot /tmp/a b.snap ").unwrap(), Command::Snapshot("/tmp/a b.snap".into()));
        assert!(parse("snapshot").is_err());
        assert!(parse("pause now").is_err());
        assert!(parse("reboot").unwrap_err().contains("unknown command"));
    }
}
