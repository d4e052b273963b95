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
    /// event journal) failed.
    #[error(transparent)]
    File(#[from] FileError),
    /// A disk image could not be opened, locked or hashed.
    #[error(transparent)]
    Disk(#[from] DiskError),
    /// An operation on the backup's own disk that succeeded on the primary
    /// still fails here after [`GIVE_UP_AFTER`](crate::lockstep::backup_disks::GIVE_UP_AFTER)
    /// of retries.
    #[error("the backup's disk {} keeps failing ({op}) where the primary's succeeded", .path.display())]
    DiskKeepsFailing {
        /// The backup's copy of the disk.
        path: PathBuf,
        /// The operation, as the message names it.
        op: String,
    },
    /// The machine could not be built, saved or restored.
    #[error(transparent)]
    Machine(#[from] MachineError),
    /// The primary could not write its log.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// The backup's replay stopped short of the log's end.
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// The machine the primary's header names cannot be built here.
    #[error("the primary's log: {0}")]
    LogHeader(#[from] HeaderError),
    /// The pair's header is missing, unreadable or of another version.
    #[error(transparent)]
    PairHeader(#[from] PairHeaderError),
    /// A thread (named first) could not be started.
    #[error("cannot start the {0} thread: {1}")]
    Thread(&'static str, #[source] std::io::Error),
    /// What watches over this run cannot hand the VM over (a recording
    /// has no backup).
    #[error("this VM has no backup to hand it over to")]
    NoBackupToHandOver,
    /// A change for the backup (a control entry) asked of a VM with no
    /// pair running (none, or one still being set up).
    #[error("this VM has no running pair to send the change to")]
    NoBackupToControl,
    /// The backup did not acknowledge, in the time given, the log that
    /// produced the outputs held here: nothing was handed over and the
    /// pair runs on.
    #[error("the backup did not catch up within {} ms: the handover is called off, the pair runs on", .0.as_millis())]
    HandOverTimedOut(std::time::Duration),
    /// The logging channel failed under the sender.
    #[error("{doing}: {source}")]
    Channel {
        /// What was being sent, e.g. `sending the backup its disk blocks`.
        doing: &'static str,
        /// How the channel failed.
        #[source]
        source: std::io::Error,
    },

    // The pair's configuration.
    /// An epoch length outside the accepted range.
    #[error(transparent)]
    EpochLength(#[from] EpochLengthError),
    /// The backup was given more disk paths than the VM has disks.
    #[error("{given} --disk options given for the VM's {disks} disks")]
    DiskCount {
        /// Disk paths given to the backup.
        given: usize,
        /// Disks the VM has.
        disks: usize,
    },
    /// Checkpoint mode was asked for with disks the two hosts share.
    #[error("checkpoint mode needs a copy of each disk on each host")]
    SharedDisks,
    /// With separate disks, the backup's copy (its path) differs from the
    /// primary's disk, so protection is refused.
    #[error("the backup's disk {} is not a copy of the primary's (their contents differ)", .0.display())]
    NotACopy(PathBuf),
    /// The backup's machine, built from the primary's header, does not hash
    /// A disk of the VM this host has no path for.
    #[error("the VM's disk in slot {slot} (the primary's {name}) has no copy here: give this host's with --disk")]
    DiskNotGiven {
        /// Its virtio slot.
        slot: usize,
        /// The file name the primary gave it.
        name: String,
    },
    /// The VM needs more memory than this host has.
    #[error("the VM has {} MiB of RAM and this host {} MiB of RAM and swap", .ram >> 20, .host >> 20)]
    TooLarge {
        /// The VM's RAM, in bytes.
        ram: u64,
        /// This host's RAM and swap, in bytes.
        host: u64,
    },
    /// The primary runs on this very host (its identity given): a
    /// failure of the host would take both sides.
    #[error("the primary runs on this host ({0}): a backup must be on another host (anti-affinity)")]
    SameHost(String),
    /// The VM has more NICs than this host was given TAPs for.
    #[error("the VM has {nics} NICs and this backup was given {given} TAPs: give one per NIC with --net tap=NAME")]
    NicNotGiven {
        /// The VM's NICs.
        nics: usize,
        /// The TAPs given.
        given: usize,
    },
    /// The primary's shared storage is not this host's.
    #[error(
        "the primary's shared storage is not this host's --shared ({0}): the arbiter could not stop a split \
         brain, so protection is refused"
    )]
    OtherStorage(String),

    /// What the peer sent breaks the pair's protocol: the stream cannot
    /// be trusted, and the backup must not go live from it.
    #[error(transparent)]
    Peer(#[from] PeerError),

    /// The other side won the arbiter: this one must halt and release
    /// nothing more.
    #[error("halting: {0}")]
    Deposed(#[from] Deposed),
    /// The arbiter's records could not be written (a pair's start).
    #[error(transparent)]
    Arbiter(#[from] ftvm_replication::arbiter::ArbiterError),
    /// The new backup did not acknowledge the machine's transfer in time:
    /// its pair did not start.
    #[error("the new backup did not acknowledge the machine within {} s", .0.as_secs())]
    TransferNotAcknowledged(std::time::Duration),
    /// The VM's I/O in flight did not finish in time for a transfer's
    /// final pause.
    #[error("the VM's I/O did not finish within {} s for the final pause", .0.as_secs())]
    QuiesceTimedOut(std::time::Duration),
    /// A side that is no transfer was asked for its successor.
    #[error("this side is no transfer to a new backup")]
    NoTransfer,
    /// A checkpoint backup was to go live before any checkpoint committed.
    #[error("no checkpoint was committed: there is nothing to take over")]
    NothingToTakeOver,
}

/// The arbiter's record of who went live, when this side asked too late:
/// the other side took over, and this one must halt.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{who} went live for generation {generation}")]
pub struct Deposed {
    /// The host that went live, by its name in the arbiter's record.
    pub who: String,
    /// The generation it went live for.
    pub generation: u64,
}

/// What the peer sent that the protocol does not allow.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// A disk write or block for a virtio slot (given) with no disk in it.
    #[error("disk data for slot {0}, which holds no disk")]
    NoDiskInSlot(u32),
    /// A disk write or block that ends past the end of the disk in the
    /// slot given.
    #[error("disk data past the end of the disk in slot {0}")]
    PastDiskEnd(u32),
    /// Blocks to make the backup's disk a copy (the disk as it was before
    /// the guest ran) after the first checkpoint, which they must precede.
    #[error("disk blocks after the first checkpoint")]
    LateDiskBlocks,
    /// A handover with disk writes after the last checkpoint, or before
    /// the first: the VM it hands over is not one the backup holds.
    #[error("a handover with no checkpoint of where the guest stopped")]
    HandOverMidInterval,
    /// Something other than pages and the first checkpoint in the transfer
    /// of a running VM's machine to a replay backup (the kind of record).
    #[error("a record of kind {0} in the transfer of the machine")]
    NotTransfer(&'static str),
    /// A control entry the backup cannot take (what it was).
    #[error("a control entry it cannot take: {0}")]
    Control(String),
    /// Pages for a checkpoint other than the next one.
    #[error("pages of checkpoint {number} when {due} was due")]
    PagesOutOfOrder {
        /// The checkpoint the pages were for.
        number: u64,
        /// The checkpoint the backup expected next.
        due: u64,
    },
    /// A checkpoint other than the next one.
    #[error("checkpoint {number} when {due} was due")]
    CheckpointOutOfOrder {
        /// The checkpoint received.
        number: u64,
        /// The checkpoint the backup expected next.
        due: u64,
    },
    /// A checkpoint's machine state would not decompress.
    #[error("checkpoint {number}: machine state: {source}")]
    CheckpointState {
        /// The checkpoint.
        number: u64,
        /// Why it would not decompress.
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint's pages would not decode.
    #[error("checkpoint {number}: pages: {source}")]
    Pages {
        /// The checkpoint.
        number: u64,
        /// Why they would not decode.
        #[source]
        source: page_delta::DecodeError,
    },
    /// The checkpoint stream is corrupt.
    #[error(transparent)]
    Stream(#[from] ReadError),
    /// The backup's copy (its path) still hashes differently from the
    /// primary's disk after the blocks that differed were received.
    #[error("the backup's disk {} still differs from the primary's after its blocks came", .0.display())]
    StillDiffers(PathBuf),
    /// A disk digest in the pair's header without the disk's size.
    #[error("the primary's disk digests name no size")]
    DigestWithoutSize,
    /// The pair's header has no digest of a disk the backup must check.
    #[error("the primary gave no digest of its disks")]
    NoDigest,
    /// The log's header has no RAM size in its machine line.
    #[error("the primary's header gives no RAM size")]
    NoRamSize,
    /// The backup's request for disk blocks would not decode.
    #[error("the backup's request: {0}")]
    BlockRequest(#[source] DigestListError),
    /// The backup asked for blocks of a virtio slot (given) with no disk
    /// in it.
    #[error("the backup asked for blocks of slot {0}, which holds no disk")]
    RequestSlot(u32),
    /// The backup asked for blocks of a disk whose size is not the
    /// primary's.
    #[error("the backup asked for blocks of a {size}-byte disk in slot {slot}")]
    RequestSize {
        /// The disk's size in bytes, as the backup gave it.
        size: u64,
        /// The disk's virtio slot.
        slot: usize,
    },
    /// The backup's own request would not fit the channel.
    #[error(transparent)]
    RequestTooLarge(#[from] RequestTooLarge),
}

/// A file of this host that failed: what was being done with it, the
/// file, and how it failed. Shared with the host library's errors.
#[derive(Debug, thiserror::Error)]
#[error("{doing} {}: {source}", .path.display())]
pub struct FileError {
    /// What was being done, e.g. `cannot read disk`.
    pub doing: &'static str,
    /// The file.
    pub path: PathBuf,
    /// How it failed.
    #[source]
    pub source: std::io::Error,
}

impl FileError {
    /// For `map_err`: an I/O error of `doing` something with `path`.
    pub fn on(doing: &'static str, path: &std::path::Path) -> impl FnOnce(std::io::Error) -> FileError {
        let path = path.to_path_buf();
        move |source| FileError { doing, path, source }
    }
}

/// Shorthand for a file error's `map_err`.
pub(crate) fn file(doing: &'static str, path: &std::path::Path) -> impl FnOnce(std::io::Error) -> ProtectionError {
    let on = FileError::on(doing, path);
    move |source| on(source).into()
}
