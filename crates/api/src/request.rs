//! The typed control API of a VM: the requests its control socket takes,
//! the replies and errors it gives, and the status it reports, as serde
//! types. On the socket each is one JSON line (`control`); a person sees
//! the readable form (`Display`), which is the `key=value` status line
//! ftvm has always printed.
//!
//! Status has a part per replication mode: a primary's (lockstep, epoch,
//! checkpoint) or a backup's, or none on a plain VM; those parts are
//! [`crate::status`]'s.

use crate::events::TransferFigures;
use crate::mode::Mode;
use crate::status::{BackupMode, PairStatus};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;

/// A request on the control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Status,
    Pause,
    Resume,
    /// Write a snapshot to `path`, which must be absolute (the VM's
    /// working directory is not the client's) and not exist unless
    /// `overwrite`; never one of the VM's disks.
    Snapshot {
        path: PathBuf,
        #[serde(default)]
        overwrite: bool,
    },
    Quit,
    /// Hand a protected VM over to its backup on purpose (a switchover,
    /// before a host goes down for maintenance): the guest stops here,
    /// the backup goes live where it stopped, and this side exits. The
    /// reply comes once the backup has claimed the VM.
    Handover,
    /// Give this running VM a backup (VMware FT's FT VMotion): its
    /// machine goes to the backup while the guest runs, and the pair
    /// starts after a short final pause. The options are `ftvm ft
    /// primary`'s; paths must be absolute. The reply comes once the pair
    /// has started (or the attempt failed).
    Protect(Box<crate::ProtectConfig>),
    /// Stop protecting the VM on purpose, without a failover: the backup
    /// stops following, and the VM runs on unprotected.
    Unprotect,
    /// Fix the pair's failure timeout (milliseconds; the heartbeats'
    /// too, nothing learned below it), on the primary: it takes the change
    /// now and sends it to its backup as a control entry on the channel
    /// (VMware FT §3.3), never by hand on the backup.
    Timeout {
        ms: u64,
    },
    /// Limit the VM to this percentage of one host core (100: no limit),
    /// a resource setting (VMware FT §3.3's "CPU share"): taken here at
    /// once, and by a primary sent to its backup as a control entry on
    /// the channel, so the VM keeps it when the backup goes live.
    CpuLimit {
        percent: u8,
    },
    /// The VM's events so far and then as they happen, one
    /// `ftvm_protection::events::EventRecord` a line, until the client
    /// hangs up.
    Events,
    /// Attach to the VM's serial console (`ftvm console`): after the reply
    /// line the connection carries the console's bytes, its recent output
    /// first, then what it shows as it comes, until the client hangs up;
    /// what the client sends is typed on the console, unless `read_only`
    /// (several clients may watch; one types).
    Console {
        #[serde(default)]
        read_only: bool,
    },
}

impl Request {
    /// Why the request cannot be taken as it is (a number out of its
    /// range), whichever way it came: the socket checks every request
    /// with this before the VM sees it.
    pub fn check(&self) -> Result<(), String> {
        use crate::limits::{CPU_LIMIT_PERCENT, TIMEOUT_MS};
        match *self {
            Request::Timeout { ms } => TIMEOUT_MS.check("a timeout", ms).map(drop),
            Request::CpuLimit { percent } => CPU_LIMIT_PERCENT.check("a CPU limit", percent).map(drop),
            _ => Ok(()),
        }
    }
}

/// The answer to a request: a reply, or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    Ok(Reply),
    Error(ControlError),
}

/// What a request did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    Status(Box<VmStatus>),
    /// The VM is paused (it may have been already).
    Paused,
    /// The VM runs (it may have been running already).
    Running,
    Snapshot {
        path: PathBuf,
        icount: u64,
        millis: u64,
    },
    Quitting,
    /// The running VM is protected: its machine went to the backup in
    /// `rounds` of pre-copy and a final pause of `pause_ms`.
    Protected {
        generation: u64,
        mode: Mode,
        /// What the transfer took.
        #[serde(flatten)]
        transfer: TransferFigures,
    },
    /// Protection stopped: the backup stopped following, and the outputs
    /// that waited for it (`released`) went.
    Unprotected {
        released: u64,
    },
    /// The backup claimed the VM (`millis` after the guest stopped here)
    /// for `generation`: this side exits.
    HandedOver {
        generation: u64,
        millis: u64,
    },
    /// The pair's failure timeout is `timeout_ms` on this side, and the
    /// change is on its way to the backup (its status shows when it has
    /// taken it).
    TimeoutSet {
        timeout_ms: u64,
    },
    /// The VM runs under the CPU limit `percent` from now on; `sent`: a
    /// primary sent it to its backup (its status shows when it has it).
    CpuLimitSet {
        percent: u8,
        sent: bool,
    },
    /// Attached to the console; `typing`: what this client sends is typed.
    Console {
        typing: bool,
    },
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "error", content = "message", rename_all = "snake_case")]
pub enum ControlError {
    /// The request could not be read.
    #[error("{0}")]
    BadRequest(String),
    /// A protected VM cannot be paused: its backup would take the silence
    /// for a failure and take over.
    #[error("a protected VM cannot be paused (its backup would take over)")]
    ProtectedCannotPause,
    /// A backup answers status only: the VM is the primary's to control
    /// (and while the backup waits for a primary, there is none).
    #[error("this is a backup, waiting for or following its primary: only status is answered")]
    BackupAnswersStatusOnly,
    #[error("{0}")]
    SnapshotFailed(String),
    #[error("snapshot needs an absolute path (the VM's working directory is not the client's): {}", .0.display())]
    RelativePath(PathBuf),
    #[error("{} exists: snapshot to a new file, or ask to overwrite it", .0.display())]
    WouldOverwrite(PathBuf),
    #[error("{} is one of the VM's disks: a snapshot there would destroy it", .0.display())]
    OntoDisk(PathBuf),
    /// Too many control connections are open at once.
    #[error("the VM's control socket is busy: too many connections")]
    Busy,
    /// A console client that wants to type cannot (another types, or
    /// nobody may).
    #[error("{0}")]
    Console(String),
    #[error("the request is longer than {0} bytes")]
    TooLong(u64),
    #[error("the VM has stopped")]
    Stopped,
    /// A handover asked of a VM with no backup.
    #[error("the VM is not protected: there is no backup to hand it over to")]
    NotProtected,
    /// A handover was already asked for and is under way.
    #[error("a handover is already under way")]
    HandOverUnderWay,
    /// An unprotect, or a handover, is already under way.
    #[error("the VM's protection is already being stopped or handed over")]
    StopUnderWay,
    /// A VM that is protected already (or on its way) was asked to be.
    #[error("the VM is protected already (or its protection is under way)")]
    AlreadyProtected,
    /// A paused VM cannot be given a backup: its machine goes across
    /// while it runs.
    #[error("the VM is paused: resume it to protect it")]
    ProtectPaused,
    /// A backup that went live moments ago cannot be given a backup
    /// until its activation records are written (milliseconds).
    #[error("the VM went live moments ago and is still writing its activation records: try again")]
    Activating,
    /// This VM cannot be given a backup (a recording, or a replay).
    #[error("this VM cannot be protected")]
    NotProtectable,
    /// The backup could not be given (why); the VM runs on as it did.
    #[error("protection failed: {0}")]
    ProtectFailed(String),
    /// The handover did not happen: the pair runs on (the backup did not
    /// catch up in time), or the primary runs on alone (the backup failed).
    #[error("the handover failed: {0}")]
    HandOverFailed(String),
}

/// Where a VM is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// A backup waiting for a primary to connect on `listen` (its logging
    /// channel's address): there is no VM yet.
    Waiting {
        listen: std::net::SocketAddr,
    },
    Running,
    Paused,
    /// A lockstep or epoch backup, replaying the primary's log.
    Replaying,
    /// A checkpoint backup, committing the primary's checkpoints.
    Following,
    /// A backup whose primary was declared failed, on its way to live.
    TakingOver,
}

impl RunState {
    fn word(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Paused => "paused",
            RunState::Replaying => "replaying",
            RunState::Following => "following",
            RunState::TakingOver => "taking-over",
            RunState::Waiting { .. } => "waiting",
        }
    }
}

/// A VM's status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmStatus {
    pub state: RunState,
    /// Instructions executed (a backup: replayed; a checkpoint backup: as
    /// of its last committed checkpoint).
    pub icount: u64,
    /// Guest time, in seconds, of a VM that runs live.
    pub guest_time_s: Option<f64>,
    /// Its part of a fault-tolerant pair, if it is in one.
    pub pair: Option<PairStatus>,
    /// The VM's CPU limit, in percent of one host core, if it has one (a
    /// backup: the one its primary sent, under which it goes live).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_limit_percent: Option<u8>,
}

impl fmt::Display for Response {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Response::Ok(reply) => write!(f, "ok {reply}"),
            Response::Error(e) => write!(f, "error {e}"),
        }
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Reply::Status(s) => write!(f, "{s}"),
            Reply::Paused => write!(f, "paused"),
            Reply::Running => write!(f, "running"),
            Reply::Snapshot { path, icount, millis } => {
                write!(f, "snapshot {} at icount {icount} in {millis} ms", path.display())
            }
            Reply::Quitting => write!(f, "quitting"),
            Reply::Protected { generation, mode, transfer: t } => write!(
                f,
                "protected ({mode}, generation {generation}): {} pages ({:.1} MiB of stream) in {} rounds \
                 and a final pause of {} ms ({} pages), {} ms in all",
                t.pages,
                t.bytes as f64 / (1 << 20) as f64,
                t.rounds,
                t.pause_ms,
                t.final_pages,
                t.total_ms
            ),
            Reply::Unprotected { released } => {
                write!(f, "unprotected: the backup stopped following ({released} held outputs released)")
            }
            Reply::HandedOver { generation, millis } => {
                write!(f, "handed over: the backup went live for generation {generation}, {millis} ms after the guest stopped here")
            }
            Reply::TimeoutSet { timeout_ms } => {
                write!(f, "timeout {timeout_ms} ms: taken here, and sent to the backup")
            }
            Reply::CpuLimitSet { percent, sent } => {
                write!(f, "cpu limit {percent} % of a host core")?;
                if *sent {
                    write!(f, ": taken here, and sent to the backup")?;
                }
                Ok(())
            }
            Reply::Console { typing: true } => write!(f, "attached to the console"),
            Reply::Console { typing: false } => write!(f, "watching the console"),
        }
    }
}

/// The status line: the state, then `key=value` fields.
impl fmt::Display for VmStatus {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        if let RunState::Waiting { listen } = self.state {
            // No VM and no pair yet: nothing else to tell.
            return write!(f, "waiting for a primary on {listen}");
        }
        write!(f, "{}", self.state.word())?;
        match &self.pair {
            Some(PairStatus::Backup(b)) => match &b.mode {
                BackupMode::Lockstep { last_end } | BackupMode::Epoch { last_end, .. } => {
                    write!(f, " icount={} last_end={last_end}", self.icount)?
                }
                BackupMode::Checkpoint { committed, .. } => write!(f, " committed={committed}")?,
            },
            _ => write!(f, " icount={}", self.icount)?,
        }
        if let Some(t) = self.guest_time_s {
            write!(f, " time={t:.3}s")?;
        }
        if let Some(p) = self.cpu_limit_percent {
            write!(f, " cpu_limit={p}%")?;
        }
        match &self.pair {
            None => Ok(()),
            Some(PairStatus::Unprotected) => write!(f, " role=primary backup=none (unprotected)"),
            Some(PairStatus::Primary(p)) => write!(f, " {p}"),
            Some(PairStatus::Backup(b)) => write!(f, " {b}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::PairEvent as Event;

    /// The transfer's figures are one struct, flattened: the JSON a client
    /// reads keeps them as fields of the reply and of the event.
    #[test]
    fn the_transfer_figures_are_fields_of_the_reply_and_the_event() {
        let transfer =
            TransferFigures { rounds: 3, pages: 70, final_pages: 5, bytes: 4096, pause_ms: 12, total_ms: 900 };
        let reply = Reply::Protected { generation: 2, mode: Mode::Checkpoint, transfer };
        let json = serde_json::to_value(&reply).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"reply": "protected", "generation": 2, "mode": "checkpoint", "rounds": 3, "pages": 70,
                               "final_pages": 5, "bytes": 4096, "pause_ms": 12, "total_ms": 900})
        );
        assert_eq!(serde_json::from_value::<Reply>(json).unwrap(), reply);
        let event = Event::MachineSent { transfer };
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"event": "machine_sent", "rounds": 3, "pages": 70, "final_pages": 5, "bytes": 4096,
                               "pause_ms": 12, "total_ms": 900})
        );
        assert_eq!(serde_json::from_value::<Event>(json).unwrap(), event);
        assert!(reply.to_string().contains("70 pages (0.0 MiB of stream) in 3 rounds and a final pause of 12 ms"));
    }
}
