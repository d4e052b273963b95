//! What can stop a VM on this host: one error type for the host library,
//! by where the fault lies (an option, a file, the image, the machine,
//! the pair, the control socket), so that a front end (the CLI, a
//! daemon) can tell a user's mistake from a broken peer without reading
//! the message. The CLI prints the message on one line and exits non-zero.

use crate::control::ControlSocketError;
use crate::host_io::{DeviceLineError, HostIoError};
use ftvm_machine::snapshot_file::SnapshotFileError;
use ftvm_machine::MachineError;
use ftvm_protection::error::{Deposed, FileError, ProtectionError};
use ftvm_replay::replayer::{HeaderError, ReplayError};
use ftvm_replay::LogError;
use ftvm_replication::arbiter::ArbiterError;
use ftvm_replication::channel::{ChannelError, Failure};
use ftvm_replication::heartbeat::HeartbeatError;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Why a VM could not be started, or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    /// An option, or a combination of options, that cannot work. The
    /// message quotes the option as the user wrote it.
    #[error("{0}")]
    Usage(String),
    /// An option of one replication mode given with another.
    #[error(transparent)]
    ModeOption(#[from] crate::ft::ModeOptionError),
    /// A file of this host failed.
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Image(#[from] ftvm_image::ImageError),
    #[error(transparent)]
    HostIo(#[from] HostIoError),
    #[error(transparent)]
    Machine(#[from] MachineError),
    #[error("snapshot {}: {problem}", .path.display())]
    Snapshot { path: PathBuf, problem: SnapshotProblem },
    #[error(transparent)]
    SnapshotFile(#[from] SnapshotFileError),
    #[error("log {name}: {problem}")]
    Log { name: String, problem: LogProblem },
    #[error(transparent)]
    Replay(#[from] ReplayError),
    #[error(transparent)]
    Protection(#[from] ProtectionError),
    #[error(transparent)]
    Channel(#[from] ChannelError),
    #[error(transparent)]
    Arbiter(#[from] ArbiterError),
    /// The cluster's etcd, as the arbiter, could not be used.
    #[error(transparent)]
    Etcd(#[from] ftvm_etcd::EtcdError),
    #[error(transparent)]
    Heartbeat(#[from] HeartbeatError),
    #[error(transparent)]
    PairKey(#[from] ftvm_replication::pair_key::PairKeyError),
    #[error(transparent)]
    Control(#[from] ControlSocketError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("logging channel: {0}")]
    LoggingChannel(#[source] std::io::Error),

    // A backup and its primary.
    #[error("the primary at {primary} sent no usable log header: {source}")]
    NoHeader {
        primary: SocketAddr,
        #[source]
        source: LogError,
    },
    /// The primary's backup did not start following.
    #[error("the backup at {backup} {reason}")]
    BackupNotReady { backup: SocketAddr, reason: NotReady },
    /// The backup checked the primary's header and cannot follow it.
    #[error("refusing to follow the primary at {primary}: {reason}")]
    Refused { primary: SocketAddr, reason: ProtectionError },
    /// The stream broke the protocol or the replica diverged: this
    /// replica must never go live.
    #[error("the backup cannot follow the primary: {0}")]
    CannotFollow(#[source] ProtectionError),
    /// The primary won the arbiter after this backup declared it failed.
    #[error("halting: {0}")]
    PrimaryWon(#[source] Deposed),
    /// The stream ended with nothing to take over (why, in words).
    #[error("{0}; the backup stops")]
    NothingToTakeOver(String),
    #[error("the host event channel closed")]
    EventsClosed,
    #[error("the guest asked to reboot, but {0}")]
    Reboot(RebootRefused),
    /// The guest's kernel printed a panic line on its console (the line,
    /// without its timestamp): it will run nothing more.
    #[error("the guest kernel panicked: {0}")]
    GuestPanicked(String),
    /// `--exec`: the command had not started this many seconds after the
    /// guest began to boot.
    #[error("the guest did not start the command within {0} s of booting (--boot-timeout); it was stopped")]
    BootTimeout(u64),
    /// `--exec`: the command ran longer than `--exec-timeout` seconds.
    #[error("the command did not finish within {0} s (--exec-timeout); the guest was stopped")]
    ExecTimeout(u64),
    /// Nothing could ever wake the guest: running on would hang.
    #[error("the guest is idle with no timer armed and no input left")]
    StuckIdle,
    /// SIGTERM or SIGINT asked the guest to power off, and it had not
    /// within `--stop-timeout`: it was stopped (exit status 128 + signo).
    #[error("the guest did not power off within {seconds} s of {signal} (--stop-timeout); it was stopped")]
    StopTimeout { signal: &'static str, signo: i32, seconds: f64 },
    /// SIGTERM or SIGINT stopped the guest (it powered off as asked)
    /// before the `--exec` command finished: the run was cut short
    /// (exit status 128 + signo).
    #[error("the command did not finish: {signal} stopped the guest (it powered off as asked)")]
    ExecInterrupted { signal: &'static str, signo: i32 },
    /// `quit` on the control socket before the `--exec` command finished.
    #[error("the command did not finish: `quit` on the control socket stopped the guest")]
    ExecQuit,
    /// `--exec`: the guest's init could not start the command (its line,
    /// e.g. a root disk it cannot mount); exit status 255, the guest's.
    #[error("the guest could not start the command: {0}")]
    ExecSetup(String),

    // Going live at the end of a replay.
    #[error(transparent)]
    Header(#[from] HeaderError),
    #[error("the log's device list: {0}")]
    Backends(#[source] DeviceLineError),
    #[error("the recorded disks or NICs are not what the machine had (a disk changed size?)")]
    DevicesChanged,
}

impl VmmError {
    /// The exit status a command-line front end gives this error: 124 (as
    /// `timeout(1)`) when `--exec` ran out of time, 2 for an option given
    /// without the mode it belongs to, 128 + the signal's number (as a
    /// shell reports a command a signal ended: 143 for SIGTERM, 130 for
    /// SIGINT) when a guest asked to power off by one did not in time,
    /// 255 when the guest could not start an `--exec` command, else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            VmmError::BootTimeout(_) | VmmError::ExecTimeout(_) => 124,
            // The status the guest's init reports for it, as before.
            VmmError::ExecSetup(_) => 255,
            // A command line that cannot work, as clap's own refusals.
            VmmError::ModeOption(_) => 2,
            VmmError::StopTimeout { signo, .. } | VmmError::ExecInterrupted { signo, .. } => {
                (128 + *signo).clamp(0, 255) as u8
            }
            _ => 1,
        }
    }
}

/// Why a guest's reboot request ends its run instead of booting it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RebootRefused {
    #[error("a recorded VM cannot reboot yet (power it off and record a new run)")]
    Recorded,
    #[error("a fault-tolerant VM cannot reboot yet (power it off and start the pair again)")]
    Protected,
    #[error("a VM restored from a snapshot cannot reboot (the snapshot does not hold its firmware and kernel)")]
    Restored,
    #[error("a VM that went live after a replay or a failover cannot reboot yet")]
    WentLive,
}

/// Why a backup did not start following its primary.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    #[error("refused protection: {0}")]
    Refused(String),
    #[error("failed before protection started: {0}")]
    Failed(Failure),
    #[error("was not ready within {0} s")]
    Timeout(u64),
}

/// What is wrong with a snapshot file given to `--restore`.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotProblem {
    #[error("unreadable device list")]
    DeviceListText,
    #[error(transparent)]
    DeviceList(#[from] DeviceLineError),
    #[error("it has fewer disks or NICs than given on the command line")]
    FewerDevices,
    #[error("virtio slot {slot} was {was} but is now {now} (a disk must keep its size)")]
    DeviceChanged { slot: usize, was: String, now: String },
    #[error("device list does not match the machine")]
    DeviceCount,
    /// The machine it holds has more RAM than this host (RAM and swap).
    #[error("its machine has {} MiB of RAM, more than this host has ({} MiB of RAM and swap)", .ram >> 20, .host >> 20)]
    TooLarge { ram: u64, host: u64 },
    #[error(transparent)]
    Machine(#[from] MachineError),
}

/// What is wrong with a replay log given to `ftvm replay`.
#[derive(Debug, thiserror::Error)]
pub enum LogProblem {
    #[error("cannot open it: {0}")]
    Open(#[source] std::io::Error),
    #[error(transparent)]
    Unreadable(#[from] LogError),
    #[error(transparent)]
    Header(#[from] HeaderError),
    #[error("{source}; replayed the valid part to instruction {replayed_to}")]
    Cut {
        #[source]
        source: LogError,
        replayed_to: u64,
    },
}

/// Shorthand for a file error's `map_err`.
pub(crate) fn file(doing: &'static str, path: &std::path::Path) -> impl FnOnce(std::io::Error) -> VmmError {
    let on = FileError::on(doing, path);
    move |source| on(source).into()
}

/// Shorthand for a usage error.
pub(crate) fn usage(message: impl Into<String>) -> VmmError {
    VmmError::Usage(message.into())
}
