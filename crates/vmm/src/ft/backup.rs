//! `ftvm ft backup`: waits for a primary, builds the same machine from the
//! log's header, replays the log as it arrives (acknowledged on receipt by
//! the channel), and stays silent: its outputs are regenerated and
//! dropped. When the primary is declared failed it asks the arbiter; on
//! winning it drains what it received to the last go-live point, goes
//! live there (disk I/O in flight is issued again, §3.4), and announces
//! the VM's MAC from this host. On losing it halts.

use super::checkpoint::backup::{self as checkpoint_backup, Committed, Disks as CheckpointDisks, Followed};
use super::epoch::backup::EpochCheck;
use super::epoch::EpochMode;
use super::lockstep::backup_disks::BackupDisks;
use super::{header_disks, hostname, DiskDigest, DiskPolicy, DiskSharing, PairArgs, SlotDisks};
use crate::api::{BackupMode, BackupStatus, ControlError, PairStatus, Reply, Request, Response, RunState, VmStatus};
use crate::control;
use crate::record::hex;
use crate::replay::{self, LiveSetup, Outcome, Replayed};
use clap::Args;
use ftvm_replay::LogReader;
use ftvm_replication::arbiter::{Arbiter, Verdict};
use ftvm_replication::channel::{LogReceiver, DEFAULT_BUFFER};
use ftvm_replication::disk_sync::{self, DigestList};
use ftvm_replication::heartbeat::Heartbeat;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct BackupArgs {
    /// Where to accept the primary's logging channel.
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: SocketAddr,
    /// The TAP for the VM's NIC once live: tap=NAME[,bridge=BR] (the MAC
    /// stays the guest's). Default: the primary's TAP and bridge names.
    #[arg(long = "net")]
    pub nets: Vec<String>,
    /// The control socket of the VM once live.
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Show the guest's console output as it is replayed (and once live).
    #[arg(long)]
    pub show_console: bool,
    /// This host's path of each of the VM's disks, in order (default: the
    /// primary's paths). With separate disks, this host's own copies.
    #[arg(long = "disk", value_name = "PATH")]
    pub disks: Vec<PathBuf>,
    /// Hold each acknowledgement this many milliseconds after receipt: a
    /// slow way back, to watch the Output Rule hold the primary's outputs.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub ack_delay: u64,
    #[command(flatten)]
    pub pair: PairArgs,
}

/// What became of the primary, as the arbiter decided.
enum Decision {
    GoLive(String),
    Halt(String),
}

pub fn run(args: &BackupArgs) -> Result<u32, String> {
    let timing = args.pair.timing()?;
    args.pair.check_shared()?;
    let nets = args.nets.iter().map(|n| parse_tap(n)).collect::<Result<Vec<_>, _>>()?;
    let listener = TcpListener::bind(args.listen).map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    eprintln!("ftvm: backup waiting for the primary on {}", args.listen);
    let receiver = Arc::new(LogReceiver::accept(&listener, DEFAULT_BUFFER).map_err(|e| e.to_string())?);
    drop(listener);
    let primary = receiver.peer();
    let (failed_tx, failed_rx) = mpsc::channel();
    let failed_tx = Mutex::new(failed_tx);
    // The header is acknowledged only once the backup knows it can follow.
    receiver.hold_acks();
    receiver
        .start(timing, move |f| {
            let _ = failed_tx.lock().unwrap().send((f, Instant::now()));
        })
        .map_err(|e| e.to_string())?;
    receiver.delay_acks(Duration::from_millis(args.ack_delay));
    // The arbiter runs beside the replay, which goes on draining the log.
    // Until the header has named the pair's generation there is nothing
    // to take over: a failure then just ends the log.
    let generation: Arc<OnceLock<u64>> = Arc::default();
    let decision: Arc<Mutex<Option<(Decision, Instant)>>> = Arc::default();
    {
        let (receiver, decision, generation) = (receiver.clone(), decision.clone(), generation.clone());
        let shared = args.pair.shared.clone();
        std::thread::spawn(move || {
            let Ok((failure, detected)) = failed_rx.recv() else { return };
            // A primary that powers the VM off closes the channel too,
            // once the backup has acknowledged the log's end: only the
            // replay, having read all that came, tells the two apart. So
            // the test-and-set waits for it to drain, which adds the
            // test-and-set's few milliseconds to a failover (the drain
            // came before going live anyway) and claims no generation
            // for a VM that was powered off. A replay that stops reading
            // (the end reached, or a divergence) leaves nothing to take
            // over.
            receiver.stop_receiving();
            let generation = generation.get().copied();
            if generation.is_some() && !receiver.wait_consumed() {
                return;
            }
            eprintln!("ftvm: the primary is declared failed: {failure}");
            if let Some(generation) = generation {
                let me = format!("backup on {}", hostname());
                let d = match Arbiter::new(&shared, generation).go_live(&me, |m| eprintln!("ftvm: {m}")) {
                    Verdict::Won => Decision::GoLive(format!("won generation {generation} at the arbiter")),
                    Verdict::Lost(who) => Decision::Halt(format!("{who} went live for generation {generation}")),
                };
                *decision.lock().unwrap() = Some((d, detected));
            }
            receiver.end_log();
        });
    }
    let (mut reader, header) = LogReader::open(receiver.pipe())
        .map_err(|e| format!("the primary at {primary} sent no usable log header: {e}"))?;
    // Everything the backup checks before it acknowledges the header; the
    // primary waits for that acknowledgement before its VM starts, and
    // hears the reason if the backup refuses.
    let Some(gen) = header.get("ft-generation").and_then(|g| g.parse::<u64>().ok()) else {
        let e = "the primary named no generation (is it `ftvm ft primary`?)";
        receiver.refuse(e);
        return Err(format!("refusing to follow the primary at {primary}: {e}"));
    };
    // Heartbeats from now on: the checks below may take a while (hashing
    // disks), and the primary must not take them for a failure.
    receiver.add_heartbeat(
        Heartbeat::start(
            SocketAddr::new(args.listen.ip(), args.pair.heartbeat_port),
            SocketAddr::new(primary.ip(), args.pair.heartbeat_port),
            gen,
            timing.interval,
        )
        .map_err(|e| e.to_string())?,
    );
    if header.get("ft-mode") == Some("checkpoint") {
        let pair = Pair { receiver, header, gen, generation, decision, primary, nets };
        return follow_checkpoints(args, pair, reader.into_input());
    }
    let follow = || -> Result<(ftvm_machine::Machine, SlotDisks, Option<BackupDisks>), String> {
        let mut m = replay::machine_from_header(&header).map_err(|e| format!("the primary's log: {e}"))?;
        m.set_dirty_tracking(true);
        if header.get("state") != Some(hex(&m.state_hash()).as_str()) {
            return Err("the machine built from the primary's header is not in its start state".into());
        }
        let policy = DiskPolicy::from_header(&header)?;
        EpochMode::from_header(&header)?;
        let disks = backup_disk_paths(&header, &args.disks)?;
        if policy.sharing == DiskSharing::Separate {
            check_copies(&header, &disks)?;
        }
        let local = match (policy.sharing, policy.backup_reads) {
            (DiskSharing::Shared, false) => None,
            (sharing, reads) => {
                let paths: Vec<(usize, &std::path::Path)> = disks.iter().map(|(s, p)| (*s, p.as_path())).collect();
                Some(BackupDisks::open(&paths, sharing == DiskSharing::Separate, reads)?)
            }
        };
        Ok((m, disks, local))
    };
    let (mut m, disks, mut local_disks) = follow().map_err(|e| {
        receiver.refuse(&e);
        format!("refusing to follow the primary at {primary}: {e}")
    })?;
    let _ = generation.set(gen);
    let received_end = Arc::new(AtomicU64::new(0));
    let status_socket = match &args.control {
        Some(path) => {
            let (r, end) = (receiver.clone(), received_end.clone());
            let setting = EpochMode::from_header(&header).ok().flatten().map(EpochMode::setting);
            let progress = move || {
                // The end first: set in the other order, status never shows
                // the machine past the end it had.
                let last_end = end.load(Ordering::SeqCst);
                let mode = match &setting {
                    Some(setting) => BackupMode::Epoch { setting: setting.clone(), last_end },
                    None => BackupMode::Lockstep { last_end },
                };
                (RunState::Replaying, r.executed(), mode)
            };
            let status = replaying_status(receiver.clone(), progress, gen);
            Some(control::serve(path, status)?)
        }
        None => None,
    };
    let mode = EpochMode::from_header(&header).expect("checked before following");
    if mode.is_some() {
        // It waits for log at every epoch end, microseconds apart.
        receiver.short_waits();
    }
    receiver.ready();
    eprintln!("ftvm: backup of the VM at {primary} (generation {gen}), replaying");
    let mut replayed = Replayed { digests: 0, epochs: mode.map(EpochCheck::new) };
    let r = receiver.clone();
    let io: &mut dyn replay::ReplayIo = match &mut local_disks {
        Some(d) => d,
        None => &mut replay::Regenerate,
    };
    let outcome = replay::replay_log(&mut reader, &mut m, io, args.show_console, &mut replayed, |i, end| {
        received_end.store(end, Ordering::SeqCst);
        r.set_executed(i)
    });
    receiver.reading_done();
    // Its locks go before the live VM opens the disks again.
    drop(local_disks);
    let outcome = match outcome {
        Ok(o) => o,
        Err(divergence) => {
            // The replica is wrong: it must never go live. The primary
            // sees the channel close and goes on alone.
            receiver.end_log();
            return Err(format!("the backup cannot follow the primary: {divergence}"));
        }
    };
    match outcome {
        Outcome::Ended(status) => {
            eprintln!(
                "ftvm: the primary ended the VM ({}) at instruction {}; {} state checks matched{}; the backup stops",
                status.map_or("stopped".to_string(), |s| format!("powered off with status {s}")),
                m.icount(),
                replayed.digests,
                epoch_summary(&replayed)
            );
            Ok(0)
        }
        Outcome::Cut(e) => {
            let decided = decision.lock().unwrap().take();
            match decided {
                Some((Decision::GoLive(why), detected)) => {
                    eprintln!(
                        "ftvm: going live at instruction {} ({why}; log drained {} ms after the failure was declared; {} state checks matched{})",
                        m.icount(),
                        detected.elapsed().as_millis(),
                        replayed.digests,
                        epoch_summary(&replayed)
                    );
                    drop(status_socket);
                    let disks = disks.into_iter().map(|(_, p)| p).collect();
                    let setup =
                        LiveSetup { control: args.control.clone(), nets, disks, announce: true, console_input: false };
                    replay::go_live(m, &header, &setup)
                }
                Some((Decision::Halt(why), _)) => Err(format!("halting: {why}")),
                None => Err(format!("the primary's log is unusable: {e}; the backup stops")),
            }
        }
    }
}

/// In epoch mode, what the check of the epoch rule saw.
fn epoch_summary(replayed: &Replayed) -> String {
    match &replayed.epochs {
        Some(c) => format!(
            "; {} inputs, each at an epoch end ({} at multiples of {}, {} where the guest idled)",
            c.inputs,
            c.inputs - c.at_idle,
            c.mode.length,
            c.at_idle
        ),
        None => String::new(),
    }
}

/// The header's disks, at this host's paths where `--disk` gives them.
fn backup_disk_paths(header: &ftvm_replay::Header, given: &[PathBuf]) -> Result<SlotDisks, String> {
    let mut disks = header_disks(header)?;
    if given.len() > disks.len() {
        return Err(format!("{} --disk options given for the VM's {} disks", given.len(), disks.len()));
    }
    for ((_, path), mine) in disks.iter_mut().zip(given) {
        *path = mine.clone();
    }
    Ok(disks)
}

/// The primary's digest of each of `disks`, from the header.
fn header_digests<'h>(header: &'h ftvm_replay::Header, disks: &[(usize, PathBuf)]) -> Result<Vec<&'h str>, String> {
    let theirs: Vec<&str> = header.get("ft-disk-digests").unwrap_or_default().split(';').collect();
    if theirs.len() != disks.len() {
        return Err("the primary gave no digest of its disks".into());
    }
    Ok(theirs)
}

/// Separate disks start identical (§4.1), or protection is refused.
fn check_copies(header: &ftvm_replay::Header, disks: &[(usize, PathBuf)]) -> Result<(), String> {
    for ((_, path), theirs) in disks.iter().zip(header_digests(header, disks)?) {
        if DiskDigest::of(path, None)?.whole() != theirs {
            return Err(format!(
                "the backup's disk {} is not a copy of the primary's (their contents differ)",
                path.display()
            ));
        }
    }
    Ok(())
}

/// Checkpoint mode: each copy of a disk that is missing or differs from
/// the primary's (by the digests in the header) is made the same size,
/// and the primary is asked for the blocks whose digests differ (Remus
/// §2.5: the copies start the same). Returns (slot, the primary's digest)
/// of those.
fn copies_to_sync(
    header: &ftvm_replay::Header,
    disks: &[(usize, PathBuf)],
    receiver: &LogReceiver,
) -> Result<Vec<(usize, String)>, String> {
    let mut to_sync = Vec::new();
    for ((slot, path), theirs) in disks.iter().zip(header_digests(header, disks)?) {
        let size = DiskDigest::size_in(theirs).ok_or("the primary's disk digests name no size")?;
        let e = |e: std::io::Error| format!("cannot make the backup's disk {}: {e}", path.display());
        let file =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(e)?;
        if file.metadata().map_err(e)?.len() != size {
            // A new copy is a sparse file: only the blocks the primary
            // has data in differ from it.
            file.set_len(size).map_err(e)?;
        }
        let mine = DiskDigest::of(path, Some(size))?;
        if mine.whole() == theirs {
            continue;
        }
        let list = DigestList { slot: *slot as u32, size, block: disk_sync::block_size(size), digests: mine.blocks };
        let blocks = list.digests.len();
        receiver.request(list.encode()).map_err(|e| e.to_string())?;
        eprintln!(
            "ftvm: the backup's disk {} differs from the primary's: asking for the blocks that differ ({blocks} compared)",
            path.display()
        );
        to_sync.push((*slot, theirs.to_string()));
    }
    Ok(to_sync)
}

/// The control socket's answers while the backup follows: only `status`
/// (the VM is the primary's to stop, pause or snapshot). `progress` tells
/// how far it is: its state, instruction count and mode's figures.
fn replaying_status(
    receiver: Arc<LogReceiver>,
    progress: impl Fn() -> (RunState, u64, BackupMode) + Send + Sync,
    generation: u64,
) -> impl Fn(Request) -> Response + Send + Sync {
    let rate = Mutex::new((Instant::now(), 0u64, 0.0f64));
    move |request| {
        if request != Request::Status {
            return Response::Error(ControlError::BackupAnswersStatusOnly);
        }
        let mut rate = rate.lock().unwrap();
        let (received, dt) = (receiver.received(), rate.0.elapsed().as_secs_f64());
        if dt >= 0.5 {
            *rate = (Instant::now(), received, (received - rate.1) as f64 * 8.0 / dt / 1e6);
        }
        let (state, icount, mode) = progress();
        let state = if receiver.failure().is_some() { RunState::TakingOver } else { state };
        let backup = BackupStatus {
            primary: receiver.peer().to_string(),
            generation,
            mode,
            log_mbit_s: rate.2,
            received,
            buffered: receiver.buffered() as u64,
        };
        let status = VmStatus { state, icount, guest_time_s: None, pair: Some(PairStatus::Backup(backup)) };
        Response::Ok(Reply::Status(Box::new(status)))
    }
}

/// `tap=NAME[,bridge=BR]`.
fn parse_tap(s: &str) -> Result<(String, Option<String>), String> {
    let (mut name, mut bridge) = (None, None);
    for opt in s.split(',') {
        match opt.split_once('=') {
            Some(("tap", v)) if !v.is_empty() => name = Some(v.to_string()),
            Some(("bridge", v)) if !v.is_empty() => bridge = Some(v.to_string()),
            _ => return Err(format!("invalid --net option '{opt}' (use tap=NAME[,bridge=BR])")),
        }
    }
    Ok((name.ok_or_else(|| format!("--net {s} names no TAP (use tap=NAME)"))?, bridge))
}

/// What a backup has once the primary's header is read.
struct Pair {
    receiver: Arc<LogReceiver>,
    header: ftvm_replay::Header,
    gen: u64,
    generation: Arc<OnceLock<u64>>,
    decision: Arc<Mutex<Option<(Decision, Instant)>>>,
    primary: SocketAddr,
    nets: Vec<(String, Option<String>)>,
}

/// Checkpoint mode (Remus): commits checkpoints as they come and, when
/// the primary fails and the arbiter agrees, goes live from the last one.
fn follow_checkpoints(args: &BackupArgs, pair: Pair, stream: impl std::io::Read) -> Result<u32, String> {
    let Pair { receiver, header, gen, generation, decision, primary, nets } = pair;
    let prepare = || -> Result<(Committed, CheckpointDisks, SlotDisks), String> {
        let ram = ram_size(&header)?;
        if DiskPolicy::from_header(&header)?.sharing != DiskSharing::Separate {
            return Err("checkpoint mode needs a copy of each disk on each host".into());
        }
        let disks = backup_disk_paths(&header, &args.disks)?;
        let to_sync = copies_to_sync(&header, &disks, &receiver)?;
        let paths: Vec<(usize, &std::path::Path)> = disks.iter().map(|(s, p)| (*s, p.as_path())).collect();
        let mut files = CheckpointDisks::open(&paths)?;
        for (slot, theirs) in to_sync {
            files.expect_blocks(slot, &theirs);
        }
        Ok((Committed::new(ram), files, disks))
    };
    let (mut held, mut files, disks) = prepare().map_err(|e| {
        receiver.refuse(&e);
        format!("refusing to follow the primary at {primary}: {e}")
    })?;
    let committed = Arc::new(AtomicU64::new(0));
    let committed_icount = Arc::new(AtomicU64::new(0));
    let status_socket = match &args.control {
        Some(path) => {
            let (c, at) = (committed.clone(), committed_icount.clone());
            let interval_ms = header.get("ft-interval-ms").and_then(|i| i.parse().ok()).unwrap_or(0);
            let progress = move || {
                let committed = c.load(Ordering::Relaxed);
                (RunState::Following, at.load(Ordering::Relaxed), BackupMode::Checkpoint { interval_ms, committed })
            };
            Some(control::serve(path, replaying_status(receiver.clone(), progress, gen))?)
        }
        None => None,
    };
    receiver.ready();
    eprintln!("ftvm: backup of the VM at {primary} (generation {gen}), committing checkpoints");
    let r = receiver.clone();
    let outcome = checkpoint_backup::follow(stream, &mut held, &mut files, |c| {
        committed_icount.store(c.icount, Ordering::Relaxed);
        committed.store(c.checkpoints, Ordering::Relaxed);
        r.set_executed(c.checkpoints);
        // Only with a checkpoint to go live from is there anything to
        // take over: until then a failure just ends the stream, and the
        // arbiter is left to the primary.
        let _ = generation.set(gen);
    });
    receiver.reading_done();
    // Their locks go before the live VM opens the disks again.
    drop(files);
    let summary = |h: &Committed| format!("{} checkpoints committed, {} disk writes applied", h.checkpoints, h.writes);
    match outcome {
        Err(e) => {
            receiver.end_log();
            Err(format!("the backup cannot follow the primary: {e}"))
        }
        Ok(Followed::Ended(status)) => {
            eprintln!(
                "ftvm: the primary ended the VM ({}); {}; the backup stops",
                status.map_or("stopped".to_string(), |s| format!("powered off with status {s}")),
                summary(&held)
            );
            Ok(0)
        }
        Ok(Followed::Cut) => {
            let decided = decision.lock().unwrap().take();
            match decided {
                Some((Decision::GoLive(why), detected)) => {
                    let line = format!(
                        "ftvm: going live from checkpoint {} at instruction {} ({why}; {}; {} ms after the failure was declared)",
                        held.epoch,
                        held.icount,
                        summary(&held),
                        detected.elapsed().as_millis()
                    );
                    let disks: Vec<PathBuf> = disks.into_iter().map(|(_, p)| p).collect();
                    let me = format!("backup on {}", hostname());
                    let records = checkpoint_backup::activate(&disks, &held, gen, &me)?;
                    let m = held.into_machine()?;
                    eprintln!("{line}");
                    for r in records {
                        eprintln!("ftvm: wrote the activation record {}", r.display());
                    }
                    drop(status_socket);
                    let setup =
                        LiveSetup { control: args.control.clone(), nets, disks, announce: true, console_input: false };
                    replay::go_live(m, &header, &setup)
                }
                Some((Decision::Halt(why), _)) => Err(format!("halting: {why}")),
                None => Err(format!(
                    "the primary's checkpoint stream ended {}; the backup stops",
                    if held.state.is_none() { "before its first checkpoint" } else { "without a failure" }
                )),
            }
        }
    }
}

/// The VM's RAM size, from the header's machine line.
fn ram_size(header: &ftvm_replay::Header) -> Result<u64, String> {
    header
        .get("machine")
        .and_then(|m| m.split(' ').find_map(|f| f.strip_prefix("ram=")))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "the primary's header gives no RAM size".to_string())
}
