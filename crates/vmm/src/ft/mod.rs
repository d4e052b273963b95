//! `ftvm ft primary` and `ftvm ft backup`: lockstep fault tolerance after
//! VMware FT, epochs after Bressoud & Schneider (`--mode epoch`), or
//! checkpoints after Remus (`--mode checkpoint`). In the replay modes the
//! primary runs the VM live and streams its replay log to the backup over
//! the logging channel; the backup replays it as it comes and, when the
//! primary is declared failed and it wins the arbiter, goes live at the
//! last go-live point it received. In checkpoint mode the same channel
//! carries whole-VM checkpoints, and the backup goes live from the last
//! one it committed.
//!
//! This module owns the options and the setting up of a pair; `primary`
//! the interface of the side that runs the VM, which `lockstep`, `epoch`
//! and `checkpoint` implement, each in a folder with its two sides;
//! `backup` the backup's run.

pub mod backup;
pub mod checkpoint;
pub mod epoch;
pub mod lockstep;
pub mod primary;

use crate::host_io::HostEvent;
use crate::record::Recorder;
use clap::Args;
use epoch::primary::Epoch;
use epoch::{EpochMode, EpochProtocol};
use ftvm_replay::Header;
use ftvm_replication::arbiter::Arbiter;
use ftvm_replication::channel::{self, Failure, LogSender, DEFAULT_BUFFER};
use ftvm_replication::disk_sync;
use ftvm_replication::heartbeat::Heartbeat;
use ftvm_replication::Timing;
use lockstep::primary::Lockstep;
use primary::Primary;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::sync::Mutex;
use std::time::Duration;

/// Options both sides take.
#[derive(Args, Clone)]
pub struct PairArgs {
    /// The shared storage both hosts reach: holds the arbiter's records
    /// and, unless --disk is given, the VM's disk (disk.img).
    #[arg(long, value_name = "DIR")]
    pub shared: PathBuf,
    /// Silence, in milliseconds, after which the other side is declared failed.
    #[arg(long, value_name = "MS", default_value_t = 500)]
    pub timeout: u64,
    /// UDP port of the heartbeats, on the logging channel's addresses.
    #[arg(long, value_name = "PORT", default_value_t = 7701)]
    pub heartbeat_port: u16,
}

impl PairArgs {
    pub fn timing(&self) -> Result<Timing, String> {
        if !(20..=60_000).contains(&self.timeout) {
            return Err(format!("--timeout {} is out of range (20 to 60000 ms)", self.timeout));
        }
        Ok(Timing::with_timeout(Duration::from_millis(self.timeout)))
    }

    fn check_shared(&self) -> Result<(), String> {
        if !self.shared.is_dir() {
            return Err(format!("the shared storage {} is not a directory", self.shared.display()));
        }
        Ok(())
    }
}

/// Where the VM's disks live (VMware FT §4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DiskSharing {
    /// One disk on the shared storage, written by the primary alone
    /// under the Output Rule.
    Shared,
    /// Each host has its own copy, identical when protection starts; the
    /// backup performs the writes on its own.
    Separate,
}

impl DiskSharing {
    pub fn name(self) -> &'static str {
        match self {
            DiskSharing::Shared => "shared",
            DiskSharing::Separate => "separate",
        }
    }
}

/// What the pair does about disks, as the header tells the backup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskPolicy {
    pub sharing: DiskSharing,
    /// The backup performs the guest's disk reads itself (§4.2).
    pub backup_reads: bool,
}

impl DiskPolicy {
    /// Whether a disk write or flush is an output the Output Rule holds:
    /// only when it changes the shared disk.
    pub fn writes_are_outputs(self) -> bool {
        self.sharing == DiskSharing::Shared
    }

    /// Whether a write must also wait for the backup to have performed
    /// earlier reads of the same blocks (§4.2 on a shared disk).
    pub fn writes_wait_for_backup_reads(self) -> bool {
        self.sharing == DiskSharing::Shared && self.backup_reads
    }

    fn to_header(self, h: &mut Header) {
        h.set("ft-disks", self.sharing.name().to_string());
        h.set("ft-disk-reads", if self.backup_reads { "backup" } else { "logged" }.to_string());
    }

    pub fn from_header(h: &Header) -> Result<DiskPolicy, String> {
        let sharing = match h.get("ft-disks") {
            Some("shared") | None => DiskSharing::Shared,
            Some("separate") => DiskSharing::Separate,
            Some(other) => return Err(format!("unknown disk sharing '{other}'")),
        };
        let backup_reads = match h.get("ft-disk-reads") {
            Some("logged") | None => false,
            Some("backup") => true,
            Some(other) => return Err(format!("unknown disk reads '{other}'")),
        };
        Ok(DiskPolicy { sharing, backup_reads })
    }
}

/// A VM's disks: (virtio slot, image path), in slot order.
pub type SlotDisks = Vec<(usize, PathBuf)>;

/// The disks a log's header names.
pub fn header_disks(h: &Header) -> Result<SlotDisks, String> {
    let backends = h.get("backends").ok_or("the header names no backends")?;
    let backends = crate::host_io::parse_description(&backends.replace(';', "\n"))?;
    Ok(backends
        .into_iter()
        .enumerate()
        .filter_map(|(slot, b)| match b {
            crate::host_io::Backend::Disk { path, .. } => Some((slot, path)),
            _ => None,
        })
        .collect())
}

/// A disk image's content, hashed in blocks ([`disk_sync`]): two copies
/// are identical when their digests are; where they are not, the blocks
/// tell what to send to make them so.
pub struct DiskDigest {
    pub size: u64,
    pub blocks: Vec<[u8; 32]>,
}

impl DiskDigest {
    /// Hashes the first `size` bytes of the disk at `path` (its whole
    /// length when None).
    pub fn of(path: &Path, size: Option<u64>) -> Result<DiskDigest, String> {
        let e = |e: std::io::Error| format!("cannot read disk {}: {e}", path.display());
        let file = std::fs::File::open(path).map_err(e)?;
        let size = match size {
            Some(s) => s,
            None => file.metadata().map_err(e)?.len(),
        };
        let blocks = disk_sync::digests(&file, size, disk_sync::block_size(size)).map_err(e)?;
        Ok(DiskDigest { size, blocks })
    }

    /// The digest of the whole disk, with its size: what the header names.
    pub fn whole(&self) -> String {
        let mut h = blake3::Hasher::new();
        h.update(&self.size.to_le_bytes());
        for b in &self.blocks {
            h.update(b);
        }
        format!("{}:{}", self.size, h.finalize().to_hex())
    }

    /// The size a header's whole digest names.
    pub fn size_in(whole: &str) -> Option<u64> {
        whole.split_once(':')?.0.parse().ok()
    }
}

/// How the backup is kept in step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// VMware FT: each input is logged at the instruction where it arrives.
    Lockstep,
    /// Bressoud & Schneider: inputs wait for the end of an epoch of
    /// --epoch-length instructions.
    Epoch,
    /// Remus: the backup does not execute; whole-VM checkpoints every
    /// --interval, outputs held until their checkpoint is acknowledged.
    Checkpoint,
}

/// What `ftvm ft primary` adds to the run options.
#[derive(Args, Clone)]
pub struct PrimaryArgs {
    /// The backup's logging-channel address (it must be listening).
    #[arg(long, value_name = "HOST:PORT")]
    pub backup: SocketAddr,
    /// Execution lag, in milliseconds, past which the primary is slowed
    /// until the backup follows; below it, a lag over 3/40 of it (75 ms by default)
    /// trims the primary's CPU share by at most 10 %.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub lag_threshold: u64,
    /// How long to wait, in seconds, for the backup to accept the channel
    /// and to be ready to follow.
    #[arg(long, value_name = "S", default_value_t = 60)]
    pub connect_wait: u64,
    /// shared: one disk on the shared storage, written by the primary
    /// alone under the Output Rule; separate: each host has its own copy
    /// (identical when protection starts, or it is refused) and the backup
    /// performs the writes on its copy (VMware FT §4.1). Default: shared;
    /// checkpoint mode always uses separate disks (Remus §2.5).
    #[arg(long, value_enum)]
    pub disk_sharing: Option<DiskSharing>,
    /// The backup performs the guest's disk reads itself instead of
    /// receiving their data in the log: less log, a slower backup (§4.2).
    #[arg(long)]
    pub backup_reads: bool,
    /// lockstep: inputs delivered at the instruction they arrive (VMware
    /// FT); epoch: inputs buffered and delivered at the end of each epoch
    /// (Bressoud & Schneider); checkpoint: whole-VM checkpoints (Remus).
    #[arg(long, value_enum, default_value_t = Mode::Lockstep)]
    pub mode: Mode,
    /// With --mode epoch: instructions per epoch.
    #[arg(long, value_name = "N", default_value_t = 65536)]
    pub epoch_length: u64,
    /// With --mode epoch: original waits for the backup's acknowledgement
    /// at every epoch end (P2); revised only before an output leaves (§4.3).
    #[arg(long, value_enum, default_value_t = EpochProtocol::Revised)]
    pub epoch_protocol: EpochProtocol,
    /// With --mode checkpoint: time between checkpoints, in milliseconds
    /// (Remus: 25, i.e. 40 per second).
    #[arg(long, value_name = "MS", default_value_t = 25)]
    pub interval: u64,
    /// With --mode checkpoint: take checkpoints only on the beat of
    /// --interval, as Remus does. By default a checkpoint is also taken
    /// as soon as the guest idles with frames waiting to leave (at most
    /// one every 2 ms), so a reply does not wait out the interval.
    #[arg(long)]
    pub no_idle_checkpoints: bool,
    #[command(flatten)]
    pub pair: PairArgs,
}

impl PrimaryArgs {
    pub fn epoch_mode(&self) -> Result<Option<EpochMode>, String> {
        match self.mode {
            Mode::Lockstep | Mode::Checkpoint => Ok(None),
            Mode::Epoch => EpochMode::new(self.epoch_length, self.epoch_protocol).map(Some),
        }
    }

    /// Where the disks live: checkpoint mode keeps a copy on each host.
    pub fn disk_sharing(&self) -> Result<DiskSharing, String> {
        match (self.mode, self.disk_sharing) {
            (Mode::Checkpoint, Some(DiskSharing::Shared)) => {
                Err("checkpoint mode keeps a copy of each disk on each host: --disk-sharing shared does not apply"
                    .into())
            }
            (Mode::Checkpoint, _) => Ok(DiskSharing::Separate),
            (_, sharing) => Ok(sharing.unwrap_or(DiskSharing::Shared)),
        }
    }

    fn checkpoint_interval(&self) -> Result<Duration, String> {
        if !(1..=10_000).contains(&self.interval) {
            return Err(format!("--interval {} is out of range (1 to 10000 ms)", self.interval));
        }
        Ok(Duration::from_millis(self.interval))
    }
}

/// The shared disk a primary uses when given none: `disk.img` in the
/// shared storage, made from the default guest's root image the first
/// time (a sparse copy).
pub fn default_shared_disk(pair: &PairArgs, rootfs: &Path) -> Result<PathBuf, String> {
    pair.check_shared()?;
    let disk = pair.shared.join("disk.img");
    if !disk.exists() {
        let tmp = pair.shared.join("disk.img.part");
        ftvm_image::sparse_copy(rootfs, &tmp)
            .map_err(|e| format!("cannot copy {} to {}: {e}", rootfs.display(), tmp.display()))?;
        std::fs::rename(&tmp, &disk).map_err(|e| format!("cannot create {}: {e}", disk.display()))?;
    }
    Ok(disk)
}

/// Connects to the backup and sets up the primary's half of the pair:
/// a fresh generation at the arbiter, heartbeats, the logging channel
/// (the header goes first), and the protection the live loop applies.
pub fn start_primary(
    args: &PrimaryArgs,
    header: &mut Header,
    events: Sender<HostEvent>,
) -> Result<Box<dyn Primary>, String> {
    args.pair.check_shared()?;
    let timing = args.pair.timing()?;
    let mode = args.epoch_mode()?;
    let interval = match args.mode {
        Mode::Checkpoint => {
            if args.backup_reads {
                return Err("--backup-reads is for the replay modes: a checkpoint backup executes nothing".into());
            }
            let interval = args.checkpoint_interval()?;
            header.set("ft-mode", "checkpoint");
            header.set("ft-interval-ms", args.interval.to_string());
            Some(interval)
        }
        _ => {
            EpochMode::to_header(mode, header);
            None
        }
    };
    let disks = DiskPolicy { sharing: args.disk_sharing()?, backup_reads: args.backup_reads };
    disks.to_header(header);
    let mut digests = Vec::new();
    if disks.sharing == DiskSharing::Separate {
        // In lockstep the backup refuses to follow unless its copies hash
        // the same; in checkpoint mode it asks for the blocks that differ.
        for (slot, path) in header_disks(header)? {
            digests.push((slot, path.clone(), DiskDigest::of(&path, None)?));
        }
        let whole: Vec<String> = digests.iter().map(|(_, _, d)| d.whole()).collect();
        header.set("ft-disk-digests", whole.join(";"));
    }
    let me = format!("primary on {}", hostname());
    let arbiter = Arbiter::claim_generation(&args.pair.shared, &me).map_err(|e| e.to_string())?;
    header.set("ft-generation", arbiter.generation().to_string());
    eprintln!("ftvm: connecting to the backup at {} (generation {})", args.backup, arbiter.generation());
    let stream = channel::connect(args.backup, Duration::from_secs(args.connect_wait)).map_err(|e| e.to_string())?;
    let local = stream.local_addr().map_err(|e| format!("logging channel: {e}"))?;
    let heartbeat = Heartbeat::start(
        SocketAddr::new(local.ip(), args.pair.heartbeat_port),
        SocketAddr::new(args.backup.ip(), args.pair.heartbeat_port),
        arbiter.generation(),
        timing.interval,
    )
    .map_err(|e| e.to_string())?;
    let events = Mutex::new(events);
    let sender = LogSender::over(stream, DEFAULT_BUFFER, timing, Some(heartbeat), move |e| {
        let _ = events.lock().unwrap().send(HostEvent::Replication(e));
    })
    .map_err(|e| e.to_string())?;
    let mut recorder = Recorder::to_backup(sender, header, crate::live::BUSY_GO_LIVE)?;
    if disks.backup_reads {
        recorder.omit_read_data();
    }
    // The backup acknowledges the header once it has checked it can
    // follow: the same machine, and with separate disks the same disks.
    let channel = recorder.channel().expect("a log to the backup");
    if !channel.wait_acked(recorder.logged(), Duration::from_secs(args.connect_wait)) {
        return Err(match channel.failure() {
            Some(Failure::Refused(why)) => format!("the backup at {} refused protection: {why}", args.backup),
            Some(f) => format!("the backup at {} failed before protection started: {f}", args.backup),
            None => format!("the backup at {} was not ready within {} s", args.backup, args.connect_wait),
        });
    }
    if let Some(interval) = interval {
        // After the header, the channel carries checkpoints, not a log.
        let mut channel = recorder.into_channel().expect("a log to the backup");
        let (blocks, bytes) = checkpoint::primary::send_disk_blocks(&mut channel, &digests)?;
        if blocks > 0 {
            eprintln!(
                "ftvm: sending the backup {blocks} blocks ({:.1} MiB) its copies of the disks lack",
                bytes as f64 / (1 << 20) as f64
            );
        }
        let c = checkpoint::primary::Checkpointer::new(channel, interval, !args.no_idle_checkpoints, arbiter, me)?;
        eprintln!(
            "ftvm: protected (checkpoints every {} ms): the backup at {} receives them",
            interval.as_millis(),
            args.backup
        );
        return Ok(Box::new(c));
    }
    let lockstep = Lockstep::new(recorder, arbiter, me, Duration::from_millis(args.lag_threshold), disks);
    eprintln!(
        "ftvm: protected ({}): the backup at {} receives the log",
        EpochMode::describe(mode).replace('_', " "),
        args.backup
    );
    Ok(match mode {
        Some(mode) => Box::new(Epoch::new(lockstep, mode)),
        None => Box::new(lockstep),
    })
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default()
        + &format!(" pid {}", std::process::id())
}
