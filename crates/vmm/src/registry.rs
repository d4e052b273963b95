//! Which VMs run on this host (`ftvm list`): each control socket, when it
//! is made, registers itself with a small file in the host's run
//! directory (its process and its socket's path), removed with the
//! socket. Listing reads the files, drops those of processes that are
//! gone, and asks each VM its status over its socket, with a time limit,
//! for its role and state: a socket that does not answer is listed as
//! such, never waited on.
//!
//! The run directory: `$FTVM_RUN_DIR`, else `$XDG_RUNTIME_DIR/ftvm`, else
//! `/run/ftvm` for root, else `/tmp/ftvm-UID` (mode 0700).

use crate::api::{PairStatus, Reply, Request, Response, RunState};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long `list` waits for each VM's answer.
pub const ANSWER_WAIT: Duration = Duration::from_secs(2);

/// A registration: one file `PID.json` in the run directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registered {
    pub pid: u32,
    /// The control socket, absolute.
    pub socket: PathBuf,
    /// The ftvm command that runs it (`run`, `ft primary`, ...).
    pub command: String,
}

/// A VM found by `list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Listed {
    pub pid: u32,
    pub socket: PathBuf,
    pub command: String,
    /// `alone`, `primary`, `backup`, `unprotected` (a primary whose backup
    /// was lost, or a backup that went live); none if it did not answer.
    pub role: Option<String>,
    /// Its run state (`running`, `paused`, `waiting`, ...), or why it did
    /// not answer.
    pub state: String,
}

/// The host's run directory for registrations.
pub fn run_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FTVM_RUN_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("ftvm");
    }
    // SAFETY: getuid(2) cannot fail and touches no memory.
    let uid = unsafe { libc::getuid() };
    if uid == 0 {
        PathBuf::from("/run/ftvm")
    } else {
        std::env::temp_dir().join(format!("ftvm-{uid}"))
    }
}

/// Removes the registration when dropped.
#[derive(Debug)]
pub struct Registration {
    file: PathBuf,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

/// Registers this process's control socket. Best effort: a VM whose run
/// directory cannot be written runs on, unlisted (with a diagnostic).
pub fn register(socket: &Path) -> Option<Registration> {
    let dir = run_dir();
    let socket = std::path::absolute(socket).unwrap_or_else(|_| socket.to_path_buf());
    let entry = Registered { pid: std::process::id(), socket, command: command_words() };
    let file = dir.join(format!("{}.json", entry.pid));
    let written = (|| -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
        let tmp = dir.join(format!(".{}.json.tmp", entry.pid));
        std::fs::write(&tmp, serde_json::to_vec(&entry).expect("a registration serializes"))?;
        std::fs::rename(&tmp, &file)
    })();
    match written {
        Ok(()) => Some(Registration { file }),
        Err(e) => {
            tracing::warn!("cannot register the VM in {} for `ftvm list`: {e}", dir.display());
            None
        }
    }
}

/// The words of this process's command line before its first option
/// (`run`, `ft primary`): what a person would call the command.
fn command_words() -> String {
    let words: Vec<String> = std::env::args().skip(1).take_while(|a| !a.starts_with('-')).collect();
    words.join(" ")
}

/// The VMs registered on this host, each asked for its status (at most
/// `wait` each). Registrations of processes that are gone are removed.
pub fn list(wait: Duration) -> Vec<Listed> {
    let dir = run_dir();
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let mut found: Vec<Registered> = entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(".json") && !n.starts_with('.')))
        .filter_map(|e| {
            let path = e.path();
            let entry: Option<Registered> = std::fs::read(&path).ok().and_then(|b| serde_json::from_slice(&b).ok());
            match entry {
                Some(r) if alive(r.pid) && r.socket.exists() => Some(r),
                // Gone (killed without cleaning up) or unreadable: stale.
                _ => {
                    let _ = std::fs::remove_file(&path);
                    None
                }
            }
        })
        .collect();
    found.sort_by_key(|r| r.pid);
    found.into_iter().map(|r| ask(r, wait)).collect()
}

fn alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else { return false };
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

fn ask(r: Registered, wait: Duration) -> Listed {
    let (role, state) = match crate::control::send(&r.socket, &Request::Status, wait) {
        Ok((Response::Ok(Reply::Status(s)), _)) => {
            let role = match &s.pair {
                None => "alone",
                Some(PairStatus::Primary(_)) => "primary",
                Some(PairStatus::Backup(_)) => "backup",
                Some(PairStatus::Unprotected) => "unprotected",
            };
            (Some(role.to_string()), state_word(s.state))
        }
        Ok((Response::Error(e), _)) => (None, format!("error: {e}")),
        Ok(_) => (None, "unexpected answer".to_string()),
        Err(crate::control::ControlSocketError::Io { source, .. })
            if matches!(source.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
        {
            (None, format!("not answering (nothing in {} s)", wait.as_secs_f64()))
        }
        Err(e) => (None, format!("not answering ({e})")),
    };
    Listed { pid: r.pid, socket: r.socket, command: r.command, role, state }
}

fn state_word(s: RunState) -> String {
    match s {
        RunState::Waiting { listen } => format!("waiting for a primary on {listen}"),
        RunState::Running => "running".into(),
        RunState::Paused => "paused".into(),
        RunState::Replaying => "replaying".into(),
        RunState::Following => "following".into(),
        RunState::TakingOver => "taking-over".into(),
    }
}
