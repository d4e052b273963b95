//! What can stop a side of a pair: one error type for the protection
//! library, by where the fault lies (this host, the pair's configuration,
//! or what the peer sent), so that a front end can tell a refused
//! protection from a broken stream without reading the message.

use crate::epoch::EpochLengthError;
use crate::pair::PairHeaderError;
use ftvm_host::DiskError;
use ftvm_machine::MachineError;
use ftvm_replay::recorder::RecordError;
use ftvm_replay::replayer::{HeaderError, ReplayError};
use ftvm_replication::channel::RequestTooLarge;
use ftvm_replication::checkpoint_stream::ReadError;
use ftvm_replication::disk_sync::DigestListError;
use ftvm_replication::page_delta;
use std::path::PathBuf;

/// Why a side of a pair cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum ProtectionError {
    /// A file of this host (a disk copy, the activation record, the
    /// event journal) failed: `doing` says what was being done with it.
    #[error("{doing} {}: {source}", .path.display())]
    File {
        doing: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Disk(#[from] DiskError),
    #[error("the backup's disk {} keeps failing ({op}) where the primary's succeeded", .path.display())]
    DiskKeepsFailing { path: PathBuf, op: String },
    #[error(transparent)]
    Machine(#[from] MachineError),
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// The machine the primary's header names cannot be built here.
    #[error("the primary's log: {0}")]
    LogHeader(#[from] HeaderError),
    #[error(transparent)]
    PairHeader(#[from] PairHeaderError),
    #[error("cannot start the {0} thread: {1}")]
    Thread(&'static str, #[source] std::io::Error),
    /// The logging channel failed under the sender.
    #[error("{doing}: {source}")]
    Channel {
        doing: &'static str,
        #[source]
        source: std::io::Error,
    },

    // The pair's configuration.
    #[error(transparent)]
    EpochLength(#[from] EpochLengthError),
    #[error("{given} --disk options given for the VM's {disks} disks")]
    DiskCount { given: usize, disks: usize },
    #[error("checkpoint mode needs a copy of each disk on each host")]
    SharedDisks,
    #[error("the backup's disk {} is not a copy of the primary's (their contents differ)", .0.display())]
    NotACopy(PathBuf),
    #[error("the machine built from the primary's header is not in its start state")]
    NotInStartState,

    /// What the peer sent breaks the pair's protocol: the stream cannot
    /// be trusted, and the backup must not go live from it.
    #[error(transparent)]
    Peer(#[from] PeerError),

    /// The other side won the arbiter: this one must halt and release
    /// nothing more.
    #[error("halting: {0}")]
    Deposed(#[from] Deposed),
    #[error("no checkpoint was committed: there is nothing to take over")]
    NothingToTakeOver,
}

/// The arbiter's record of who went live, when this side asked too late:
/// the other side took over, and this one must halt.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{who} went live for generation {generation}")]
pub struct Deposed {
    pub who: String,
    pub generation: u64,
}

/// What the peer sent that the protocol does not allow.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("disk data for slot {0}, which holds no disk")]
    NoDiskInSlot(u32),
    #[error("disk data past the end of the disk in slot {0}")]
    PastDiskEnd(u32),
    #[error("disk blocks after the first checkpoint")]
    LateDiskBlocks,
    #[error("pages of checkpoint {number} when {due} was due")]
    PagesOutOfOrder { number: u64, due: u64 },
    #[error("checkpoint {number} when {due} was due")]
    CheckpointOutOfOrder { number: u64, due: u64 },
    #[error("checkpoint {number}: machine state: {source}")]
    CheckpointState {
        number: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("checkpoint {number}: pages: {source}")]
    Pages {
        number: u64,
        #[source]
        source: page_delta::DecodeError,
    },
    #[error(transparent)]
    Stream(#[from] ReadError),
    #[error("the backup's disk {} still differs from the primary's after its blocks came", .0.display())]
    StillDiffers(PathBuf),
    #[error("the primary's disk digests name no size")]
    DigestWithoutSize,
    #[error("the primary gave no digest of its disks")]
    NoDigest,
    #[error("the primary's header gives no RAM size")]
    NoRamSize,
    #[error("the backup's request: {0}")]
    BlockRequest(#[source] DigestListError),
    #[error("the backup asked for blocks of slot {0}, which holds no disk")]
    RequestSlot(u32),
    #[error("the backup asked for blocks of a {size}-byte disk in slot {slot}")]
    RequestSize { size: u64, slot: usize },
    /// The backup's own request would not fit the channel.
    #[error(transparent)]
    RequestTooLarge(#[from] RequestTooLarge),
}

/// Shorthand for a file error's `map_err`.
pub(crate) fn file(doing: &'static str, path: &std::path::Path) -> impl FnOnce(std::io::Error) -> ProtectionError {
    let path = path.to_path_buf();
    move |source| ProtectionError::File { doing, path, source }
}
