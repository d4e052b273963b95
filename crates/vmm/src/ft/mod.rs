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
//! The modes themselves are the protection library's (`ftvm_protection`),
//! and a pair's configuration the API's (`ftvm_api::pair_config`, taken
//! here typed: no command line); this module owns what this host makes
//! of that configuration ([`PairSetup`], [`ProtectSetup`]: a key, an
//! arbiter, a journal) and the setting up of a pair on this host: the
//! primary's (`start_primary`) and the backup's run (`backup`).

pub mod backup;
pub mod protect;

use crate::error::{file, usage, NotReady, VmmError};
use crate::host_io::HostEvent;
use ftvm_etcd::{Endpoints, Etcd, EtcdArbiter, EtcdTls};
use ftvm_machine::Machine;
use ftvm_protection::checkpoint;
use ftvm_protection::control::TIMEOUT_MS;
use ftvm_protection::epoch::primary::Epoch;
use ftvm_protection::epoch::{EpochMode, EpochProtocol};
use ftvm_protection::events::{Events, PairEvent};
use ftvm_protection::lockstep::primary::Lockstep;
use ftvm_protection::pair::PAIR_HEADER_VERSION;
use ftvm_protection::pair::{DiskDigest, DiskPolicy, DiskSharing, Mode, ModeSetting, PairDisk, PairHeader, SlotDisks};
use ftvm_protection::primary::Primary;
use ftvm_replay::recorder::Recorder;
use ftvm_replay::{Header, LogWriter};
use ftvm_replication::arbiter::{Arbiter, ArbiterStore, SharedDir};
use ftvm_replication::channel::{self, Failure, LogSender, DEFAULT_BUFFER};
use ftvm_replication::fence::Fence;
use ftvm_replication::heartbeat::Heartbeat;
use ftvm_replication::isolation::{self, Isolation, Outside};
use ftvm_replication::pair_key::PairKey;
use ftvm_replication::{LiveTiming, Timing};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use ftvm_api::pair_config::{
    host_port, AddressError, BackupConfig, BackupNic, ModeOptionError, PairConfig, ProtectConfig, DEFAULT_EPOCH_LENGTH,
    DEFAULT_INTERVAL_MS,
};

/// What this host makes of a pair's configuration: its key, timing,
/// isolation check, journal and arbiter.
pub trait PairSetup {
    /// The pair's key: the file given, or the shared storage's (made if
    /// there is none yet).
    fn key(&self) -> Result<PairKey, VmmError>;
    /// The failure timeouts, checked.
    fn timing(&self) -> Result<Timing, VmmError>;
    /// The isolation check before contending at the arbiter: None when
    /// turned off, or when there is nothing to probe (said once).
    fn isolation(&self) -> Result<Option<Isolation>, VmmError>;
    /// This side's journal of events (with its file, if asked for).
    fn journal(&self) -> Result<Events, VmmError>;
    /// The shared storage's directory, where `what` is looked for when
    /// not given: an error without one (a pair on etcd).
    fn shared_dir(&self, what: &str) -> Result<&Path, VmmError>;
    /// Where the pair's arbiter records its generations: the shared
    /// directory, or the VM's keys in etcd.
    fn arbiter_store(&self) -> Result<Arc<dyn ArbiterStore>, VmmError>;
}

impl PairSetup for PairConfig {
    fn key(&self) -> Result<PairKey, VmmError> {
        Ok(match &self.pair_key {
            Some(path) => PairKey::read(path)?,
            None => PairKey::read_or_create(&self.shared_dir("the pair's key (--pair-key)")?.join("pair.key"))?,
        })
    }

    fn timing(&self) -> Result<Timing, VmmError> {
        TIMEOUT_MS.check("--timeout", self.timeout).map_err(usage)?;
        if self.min_timeout < *TIMEOUT_MS.range.start() || self.min_timeout > self.timeout {
            return Err(usage(format!(
                "--min-timeout {} is out of range ({} ms to --timeout, {} ms)",
                self.min_timeout,
                TIMEOUT_MS.range.start(),
                self.timeout
            )));
        }
        Ok(Timing::new(Duration::from_millis(self.timeout), Duration::from_millis(self.min_timeout)))
    }

    fn isolation(&self) -> Result<Option<Isolation>, VmmError> {
        if !(100..=600_000).contains(&self.isolation_defer) {
            return Err(usage(format!(
                "--isolation-defer {} is out of range (100 to 600000 ms)",
                self.isolation_defer
            )));
        }
        if self.no_isolation_check {
            return Ok(None);
        }
        let iso = Isolation::new(self.isolation_addresses.clone(), Duration::from_millis(self.isolation_defer));
        if iso.addresses().is_empty() {
            eprintln!(
                "ftvm: no isolation address (none given, no default gateway): this side cannot tell \
                 whether it is the one cut off (--isolation-address IP)"
            );
            return Ok(None);
        }
        // An address that does not answer now, while the network is whole
        // (a gateway that drops ICMP echo), would make this side defer at
        // every failover: the check is left off, and said so.
        match iso.probe(isolation::PROBE_WAIT) {
            Outside::Reached(_) => Ok(Some(iso)),
            Outside::Unreached => {
                let list: Vec<String> = iso.addresses().iter().map(|a| a.to_string()).collect();
                eprintln!(
                    "ftvm: no isolation address answers an echo request now ({}): the isolation check is off",
                    list.join(", ")
                );
                Ok(None)
            }
            Outside::NotChecked(why) => {
                eprintln!("ftvm: {why}: the isolation check is off");
                Ok(None)
            }
        }
    }

    fn journal(&self) -> Result<Events, VmmError> {
        match &self.events {
            Some(path) => Ok(Events::with_file(path)?),
            None => Ok(Events::default()),
        }
    }

    fn shared_dir(&self, what: &str) -> Result<&Path, VmmError> {
        let Some(dir) = &self.shared else {
            return Err(usage(format!("with --etcd there is no shared storage: give {what}")));
        };
        if !dir.is_dir() {
            return Err(usage(format!("the shared storage {} is not a directory", dir.display())));
        }
        Ok(dir)
    }

    fn arbiter_store(&self) -> Result<Arc<dyn ArbiterStore>, VmmError> {
        match (&self.etcd, &self.vm_name) {
            (Some(urls), Some(vm)) => {
                let tls = self.etcd_credentials.as_deref().map(EtcdTls::from_dir).transpose()?;
                let etcd = Arc::new(Etcd::new(Endpoints::parse(urls, tls)?)?);
                Ok(Arc::new(EtcdArbiter::new(etcd, vm)?))
            }
            (Some(_), None) => Err(usage("--etcd needs --vm-name")),
            (None, _) => Ok(SharedDir::store(self.shared_dir("the arbiter's storage (--shared)")?)),
        }
    }
}

/// The disks a log's header names.
pub fn header_disks(h: &Header) -> Result<SlotDisks, VmmError> {
    Ok(crate::replay::header_backends(h)?
        .into_iter()
        .enumerate()
        .filter_map(|(slot, b)| match b {
            crate::host_io::Backend::Disk { path, .. } => Some((slot, path)),
            _ => None,
        })
        .collect())
}

/// What this host makes of a primary's configuration: its checks that
/// need `VmmError`'s exit status, its epoch mode, disks and interval.
pub trait ProtectSetup {
    /// Refuses port 0 in a `protect` request that came as JSON, past the
    /// command line's value parsers.
    fn check_ports(&self) -> Result<(), VmmError>;
    /// The epoch mode, in epoch mode.
    fn epoch_mode(&self) -> Result<Option<EpochMode>, VmmError>;
    /// Where the disks live: checkpoint mode keeps a copy on each host.
    fn disk_sharing(&self) -> Result<DiskSharing, VmmError>;
    /// The time between checkpoints, checked.
    fn checkpoint_interval(&self) -> Result<Duration, VmmError>;
}

impl ProtectSetup for ProtectConfig {
    fn check_ports(&self) -> Result<(), VmmError> {
        if self.backup.port() == 0 {
            return Err(usage(format!("--backup {}: {}", self.backup, AddressError::PortZero)));
        }
        if self.pair.heartbeat_port == 0 {
            return Err(usage(format!("--heartbeat-port 0: {}", AddressError::PortZero)));
        }
        Ok(())
    }

    fn epoch_mode(&self) -> Result<Option<EpochMode>, VmmError> {
        match self.mode {
            Mode::Lockstep | Mode::Checkpoint => Ok(None),
            Mode::Epoch => EpochMode::new(
                self.epoch_length.unwrap_or(DEFAULT_EPOCH_LENGTH),
                self.epoch_protocol.unwrap_or(EpochProtocol::Revised),
            )
            .map(Some)
            .map_err(|e| usage(e.to_string())),
        }
    }

    fn disk_sharing(&self) -> Result<DiskSharing, VmmError> {
        match (self.mode, self.disk_sharing) {
            (Mode::Checkpoint, Some(DiskSharing::Shared)) => Err(usage(
                "checkpoint mode keeps a copy of each disk on each host: --disk-sharing shared does not apply",
            )),
            (Mode::Checkpoint, _) => Ok(DiskSharing::Separate),
            // A pair on etcd has no shared storage for a disk.
            (_, Some(DiskSharing::Shared)) if self.pair.etcd.is_some() => Err(usage(
                "with --etcd there is no shared storage: each host keeps its own disk (--disk-sharing separate)",
            )),
            (_, None) if self.pair.etcd.is_some() => Ok(DiskSharing::Separate),
            (_, sharing) => Ok(sharing.unwrap_or(DiskSharing::Shared)),
        }
    }

    fn checkpoint_interval(&self) -> Result<Duration, VmmError> {
        let interval = self.interval.unwrap_or(DEFAULT_INTERVAL_MS);
        if !(1..=10_000).contains(&interval) {
            return Err(usage(format!("--interval {interval} is out of range (1 to 10000 ms)")));
        }
        Ok(Duration::from_millis(interval))
    }
}

/// Files a run created on its way to starting a pair, removed when this
/// is dropped unless disarmed: a failed start leaves nothing of its own
/// behind on the shared storage, and never touches what was there.
#[derive(Default)]
pub struct Leftovers {
    paths: Vec<PathBuf>,
    /// Generations claimed at the arbiter, taken back likewise.
    claims: Vec<(Arc<dyn ArbiterStore>, u64)>,
}

impl std::fmt::Debug for Leftovers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let claims: Vec<u64> = self.claims.iter().map(|(_, g)| *g).collect();
        f.debug_struct("Leftovers").field("paths", &self.paths).field("claims", &claims).finish()
    }
}

impl Leftovers {
    /// `path` was created by this run: remove it if the start fails.
    pub fn add(&mut self, path: PathBuf) {
        self.paths.push(path);
    }

    /// `generation` was claimed by this run: take it back if the start
    /// fails.
    pub fn add_claim(&mut self, arbiter: &Arbiter) {
        self.claims.push((arbiter.store().clone(), arbiter.generation()));
    }

    /// The start succeeded: what was created stays.
    pub fn disarm(&mut self) {
        self.paths.clear();
        self.claims.clear();
    }
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        for path in self.paths.drain(..).rev() {
            let _ = std::fs::remove_file(path);
        }
        for (store, generation) in self.claims.drain(..) {
            store.abandon(generation);
        }
    }
}

/// The shared disk a primary uses when given none: `disk.img` in the
/// shared storage, made from the default guest's root image the first
/// time (a sparse copy). A disk made here goes into `made`, to be
/// removed if the primary does not start.
pub fn default_shared_disk(pair: &PairConfig, rootfs: &Path, made: &mut Leftovers) -> Result<PathBuf, VmmError> {
    let shared = pair.shared_dir("the VM's disk (--disk)")?;
    let disk = shared.join("disk.img");
    if !disk.exists() {
        let tmp = shared.join("disk.img.part");
        let mut part = Leftovers::default();
        part.add(tmp.clone());
        ftvm_image::sparse_copy(rootfs, &tmp).map_err(file("cannot copy the guest's root disk to", &tmp))?;
        std::fs::rename(&tmp, &disk).map_err(file("cannot create", &disk))?;
        part.disarm();
        made.add(disk.clone());
    }
    Ok(disk)
}

/// The primary's half of a pair, connected: the backup has checked the
/// header and is ready to follow.
pub struct Connected {
    /// The channel, the header written and acknowledged.
    pub channel: LogSender,
    /// The pair's generation, claimed at the arbiter.
    pub arbiter: Arbiter,
    /// This side's name in the arbiter's records.
    pub me: String,
    /// The disks as the pair treats them.
    pub disks: DiskPolicy,
    /// With separate disks, this host's disks and their digests, as the
    /// header named them (a checkpoint backup asks for the blocks its
    /// copies lack).
    pub digests: Vec<(usize, PathBuf, DiskDigest)>,
    /// A running VM's separate disks, which the transfer makes the same
    /// on the backup (slot, path).
    pub copies: SlotDisks,
    /// Epochs, if the pair runs in epoch mode.
    pub epoch: Option<EpochMode>,
    /// Checkpoints' interval, if the pair runs in checkpoint mode.
    pub interval: Option<Duration>,
}

/// Connects to the backup for a pair described by `args` and `header`
/// (the machine; the pair's part is added here): a fresh generation at
/// the arbiter, heartbeats, the logging channel with the header first,
/// and the backup's acknowledgement that it can follow.
pub fn connect_pair(
    args: &ProtectConfig,
    header: &mut Header,
    host_events: Sender<HostEvent>,
    events: &Events,
    fence: Fence,
) -> Result<Connected, VmmError> {
    // No check_mode_options here: a typed `protect` request (JSON) gives
    // every field, the other modes' included; only a command line's
    // option given without its mode is a mistake.
    args.check_ports()?;
    let store = args.pair.arbiter_store()?;
    let timing = args.pair.timing()?;
    let epoch = args.epoch_mode()?;
    let interval = match args.mode {
        Mode::Checkpoint => {
            if args.backup_reads {
                return Err(usage("--backup-reads is for the replay modes: a checkpoint backup executes nothing"));
            }
            Some(args.checkpoint_interval()?)
        }
        _ => None,
    };
    let setting = match (interval, epoch) {
        (Some(interval), _) => ModeSetting::Checkpoint { interval_ms: interval.as_millis() as u64 },
        (None, Some(mode)) => ModeSetting::Epoch(mode),
        (None, None) => ModeSetting::Lockstep,
    };
    let disks = DiskPolicy { sharing: args.disk_sharing()?, backup_reads: args.backup_reads };
    let streamed = ftvm_replay::replayer::is_streamed(header);
    let mut digests = Vec::new();
    let mut copies = Vec::new();
    let mut pair_disks = Vec::new();
    for (slot, path) in header_disks(header)? {
        // In lockstep the backup refuses to follow unless its copies hash
        // the same; in checkpoint mode it asks for the blocks that differ.
        // A running VM's disk is hashed only once its writes go into the
        // stream (`protection::transfer`): the header gives its size.
        let digest = match disks.sharing {
            DiskSharing::Separate if streamed => {
                let size = std::fs::metadata(&path).map_err(crate::error::file("cannot read disk", &path))?.len();
                copies.push((slot, path.clone()));
                Some(DiskDigest::streamed(size))
            }
            DiskSharing::Separate => {
                let d = DiskDigest::of(&path, None)?;
                let whole = d.whole();
                digests.push((slot, path.clone(), d));
                Some(whole)
            }
            DiskSharing::Shared => None,
        };
        pair_disks.push(PairDisk { slot, path, digest });
    }
    let me = format!("primary on {}", hostname());
    let arbiter = Arbiter::claim_generation(store, &me)?;
    // Until the header is on its way no backup has seen this generation,
    // and a failed start takes its record back. Once it may have reached
    // one, the record stays: a backup that read it may still contend for
    // the generation, which must then never be claimed again.
    let mut claimed = Leftovers::default();
    claimed.add_claim(&arbiter);
    let arbiter = arbiter.with_isolation(args.pair.isolation()?);
    let pair = PairHeader {
        version: PAIR_HEADER_VERSION,
        generation: arbiter.generation(),
        mode: setting,
        disk_policy: disks,
        disks: pair_disks,
        storage_token: arbiter.storage_token().to_string(),
        host: ftvm_protection::pair::host_identity(args.pair.host_id.as_deref()),
    };
    pair.write(header);
    eprintln!("ftvm: connecting to the backup at {} (generation {})", args.backup, arbiter.generation());
    let key = args.pair.key()?;
    let (stream, session) = channel::connect(args.backup, Duration::from_secs(args.connect_wait), &key)?;
    let local = stream.local_addr().map_err(VmmError::LoggingChannel)?;
    // The primary beats from a port of its own (its pair's backup answers
    // where the beats come from): a VM whose backup moves is in two
    // pairs at once for a while.
    // One set of failure detection settings for the heartbeats and the
    // channel: a control entry changes them together.
    let timing = LiveTiming::new(timing);
    let heartbeat = Heartbeat::start(
        SocketAddr::new(local.ip(), 0),
        SocketAddr::new(args.backup.ip(), args.pair.heartbeat_port),
        arbiter.generation(),
        timing.clone(),
        &key,
    )?;
    let host_events = Mutex::new(host_events);
    let sender = LogSender::over(stream, session, DEFAULT_BUFFER, timing, Some(heartbeat), fence, move |e| {
        let _ = host_events.lock().unwrap().send(HostEvent::Replication(e));
    })?;
    claimed.disarm();
    let header_only = LogWriter::new(sender, header).map_err(VmmError::LoggingChannel)?;
    let header_len = header_only.bytes_written();
    let channel = header_only.into_sink();
    // The backup acknowledges the header once it has checked it can
    // follow: the same machine, and with separate disks the same disks.
    if !channel.wait_acked(header_len, Duration::from_secs(args.connect_wait)) {
        let reason = match channel.failure() {
            Some(Failure::Refused(why)) => NotReady::Refused(why),
            Some(f) => NotReady::Failed(f),
            None => NotReady::Timeout(args.connect_wait),
        };
        let e = VmmError::BackupNotReady { backup: args.backup, reason };
        events.emit(PairEvent::RefusedProtection { reason: e.to_string() });
        return Err(e);
    }
    Ok(Connected { channel, arbiter, me, disks, digests, copies, epoch, interval })
}

/// Connects to the backup and sets up the primary's half of the pair for
/// a VM about to start (`header` describes it): the protection the live
/// loop applies from the first instruction.
pub fn start_primary(
    args: &ProtectConfig,
    header: &mut Header,
    host_events: Sender<HostEvent>,
    events: &Events,
    fence: Fence,
) -> Result<Box<dyn Primary<Machine>>, VmmError> {
    let Connected { mut channel, arbiter, me, disks, digests, epoch, interval, .. } =
        connect_pair(args, header, host_events, events, fence)?;
    // The backup follows from the first instruction: its generation may
    // go live from now on.
    arbiter.mark_started()?;
    let protected =
        |mode: Mode| PairEvent::Protected { backup: args.backup.to_string(), generation: arbiter.generation(), mode };
    if let Some(interval) = interval {
        // After the header, the channel carries checkpoints, not a log.
        send_disk_blocks(&mut channel, &digests, events)?;
        let protected = protected(Mode::Checkpoint);
        let idle_checkpoints = !args.no_idle_checkpoints;
        let c =
            checkpoint::primary::Checkpointer::new(channel, interval, idle_checkpoints, arbiter, me, events.clone())?;
        eprintln!(
            "ftvm: protected (checkpoints every {} ms): the backup at {} receives them",
            interval.as_millis(),
            args.backup
        );
        events.emit(protected);
        return Ok(Box::new(c));
    }
    let protected = protected(if epoch.is_some() { Mode::Epoch } else { Mode::Lockstep });
    let lag_threshold = Duration::from_millis(args.lag_threshold);
    let name = format!("the backup at {}", channel.peer());
    let written = channel.written();
    let mut recorder = Recorder::resume(channel, written, name, Some(ftvm_protection::lockstep::BUSY_GO_LIVE));
    if disks.backup_reads {
        recorder.omit_read_data();
    }
    let lockstep = Lockstep::new(recorder, arbiter, me, events.clone(), lag_threshold, disks);
    eprintln!(
        "ftvm: protected ({}): the backup at {} receives the log",
        EpochMode::describe(epoch).replace('_', " "),
        args.backup
    );
    events.emit(protected);
    Ok(match epoch {
        Some(mode) => Box::new(Epoch::new(lockstep, mode)),
        None => Box::new(lockstep),
    })
}

/// Sends the blocks a checkpoint backup's copies of the disks lack (it
/// asked with its digests when it checked the header).
pub fn send_disk_blocks(
    channel: &mut LogSender,
    digests: &[(usize, PathBuf, DiskDigest)],
    events: &Events,
) -> Result<(), VmmError> {
    let (blocks, bytes) = checkpoint::primary::send_disk_blocks(channel, digests)?;
    if blocks > 0 {
        eprintln!(
            "ftvm: sending the backup {blocks} blocks ({:.1} MiB) its copies of the disks lack",
            bytes as f64 / (1 << 20) as f64
        );
        events.emit(PairEvent::DiskBlocksSent { blocks: blocks as u64, bytes });
    }
    Ok(())
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default()
        + &format!(" pid {}", std::process::id())
}
