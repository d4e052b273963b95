//! `ftvm ft primary` and `ftvm ft backup`: lockstep fault tolerance after
//! VMware FT. The primary runs the VM live and streams its replay log to
//! the backup over the logging channel; the backup replays it as it comes
//! and, when the primary is declared failed and it wins the arbiter, goes
//! live at the last go-live point it received.
//!
//! This module owns the options and the setting up of a pair; `primary`
//! what the live loop does under protection, `backup` the backup's run.

pub mod backup;
pub mod primary;

use crate::record::Recorder;
use crate::HostEvent;
use clap::Args;
use ftvm_replay::Header;
use ftvm_replication::arbiter::Arbiter;
use ftvm_replication::channel::{self, LogSender, DEFAULT_BUFFER};
use ftvm_replication::heartbeat::Heartbeat;
use ftvm_replication::Timing;
use primary::Protection;
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

/// What `ftvm ft primary` adds to the run options.
#[derive(Args, Clone)]
pub struct PrimaryArgs {
    /// The backup's logging-channel address (it must be listening).
    #[arg(long, value_name = "HOST:PORT")]
    pub backup: SocketAddr,
    /// Execution lag, in milliseconds, past which the primary is slowed.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub lag_threshold: u64,
    /// How long to wait, in seconds, for the backup to accept the channel.
    #[arg(long, value_name = "S", default_value_t = 60)]
    pub connect_wait: u64,
    #[command(flatten)]
    pub pair: PairArgs,
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
) -> Result<(Recorder, Protection), String> {
    args.pair.check_shared()?;
    let timing = args.pair.timing()?;
    let me = format!("primary on {}", hostname());
    let arbiter = Arbiter::claim_generation(&args.pair.shared, &me)?;
    header.set("ft-generation", arbiter.generation().to_string());
    eprintln!("ftvm: connecting to the backup at {} (generation {})", args.backup, arbiter.generation());
    let stream = channel::connect(args.backup, Duration::from_secs(args.connect_wait))?;
    let local = stream.local_addr().map_err(|e| format!("logging channel: {e}"))?;
    let heartbeat = Heartbeat::start(
        SocketAddr::new(local.ip(), args.pair.heartbeat_port),
        SocketAddr::new(args.backup.ip(), args.pair.heartbeat_port),
        arbiter.generation(),
        timing.interval,
    )?;
    let events = Mutex::new(events);
    let sender = LogSender::over(stream, DEFAULT_BUFFER, timing, Some(heartbeat), move |e| {
        let _ = events.lock().unwrap().send(HostEvent::Replication(e));
    })?;
    let recorder = Recorder::to_backup(sender, header, crate::live::KEEPALIVE)?;
    let protection = Protection::new(arbiter, me, Duration::from_millis(args.lag_threshold));
    eprintln!("ftvm: protected: the backup at {} receives the log", args.backup);
    Ok((recorder, protection))
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default()
        + &format!(" pid {}", std::process::id())
}
