//! `ftvm ft backup`: waits for a primary, builds the same machine from the
//! log's header, replays the log as it arrives (acknowledged on receipt by
//! the channel), and stays silent: its outputs are regenerated and
//! dropped. When the primary is declared failed it asks the arbiter; on
//! winning it drains what it received to the last go-live point, goes
//! live there (disk I/O in flight is issued again, §3.4), and announces
//! the VM's MAC from this host. On losing it halts.
//! A primary that hands the VM over on purpose ends its stream with a
//! handover mark: the backup then claims the generation at once (no
//! failure to confirm, no isolation check) and goes live where the
//! primary stopped.

use super::{hostname, BackupConfig, PairSetup};
use crate::api::{BackupMode, BackupStatus, ControlError, PairStatus, Reply, Request, Response, RunState, VmStatus};
use crate::control;
use crate::error::VmmError;
use crate::host_io::HostIo;
use crate::replay::{self, LiveSetup};
use ftvm_host::tap::Tap;
use ftvm_machine::Machine;
use ftvm_protection::backup::{Backup, Followed, Progress, Report, TakeOver};
use ftvm_protection::checkpoint::backup::CheckpointBackup;
use ftvm_protection::checkpoint::backup::PendingActivation;
use ftvm_protection::control::ControlEntry;
use ftvm_protection::error::{Deposed, PeerError, ProtectionError};
use ftvm_protection::events::PairEvent;
use ftvm_protection::local::LocalFiles;
use ftvm_protection::lockstep::backup::ReplayBackup;
use ftvm_protection::pair::{ModeSetting, PairHeader};
use ftvm_replay::LogReader;
use ftvm_replication::arbiter::{Arbiter, Verdict};
use ftvm_replication::channel::{HandshakeError, LogReceiver, DEFAULT_BUFFER};
use ftvm_replication::heartbeat::Heartbeat;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

/// What became of the primary, as the arbiter decided.
enum Decision {
    GoLive(String),
    /// The primary won.
    Halt(Deposed),
}

/// `ftvm ft backup`: follows the primary ([`follow`]) and, if it goes
/// live, runs the VM on this host's backends until it ends.
pub fn run(args: &BackupConfig) -> Result<u32, VmmError> {
    match follow(args)? {
        Outcome::Ended(_) => Ok(0),
        Outcome::Live(live) => {
            let GoingLive { machine, activation, header, setup, taps, receiver } = *live;
            let status = replay::go_live(machine, &header, &setup, taps, activation);
            // The channel stays open while the VM runs, as it always did.
            drop(receiver);
            status
        }
    }
}

/// How a backup's following came out, short of an error.
pub enum Outcome {
    /// The primary ended the VM (with the guest's exit status, if it
    /// powered off): the backup stops.
    Ended(Option<u32>),
    /// The backup won the VM (a failure or a handover) and goes live.
    Live(Box<GoingLive>),
}

/// A backup that won its VM, stopped where it goes live: what [`run`]
/// hands to the live loop. Split from it so a front end that serves the
/// VM's I/O itself (the in-process tests of `tests/ft_inprocess.rs`, which
/// have no TAP) can take the machine here.
pub struct GoingLive {
    /// The machine, at the go-live point (or checkpoint).
    pub machine: Machine,
    /// In checkpoint mode, the activation records still to write.
    pub activation: Option<PendingActivation>,
    /// The primary's header (the machine, its devices and backends).
    pub header: ftvm_replay::Header,
    /// What the live VM gets: this host's disks and TAPs, the segments to
    /// send again, the frames the primary never delivered.
    pub setup: LiveSetup,
    /// The TAPs opened while following.
    pub taps: Vec<Tap>,
    /// The channel, kept open until the live VM ends.
    pub receiver: Arc<LogReceiver>,
}

/// `ftvm ft backup` up to going live: accepts the primary, checks its
/// header, follows its stream, and asks the arbiter when it is declared
/// failed (or claims at once after a handover).
pub fn follow(args: &BackupConfig) -> Result<Outcome, VmmError> {
    let timing = args.pair.timing()?;
    let store = args.pair.arbiter_store()?;
    let nets: Vec<(String, Option<String>)> = args.nets.iter().map(|n| (n.tap.clone(), n.bridge.clone())).collect();
    let events = args.pair.journal()?;
    let key = args.pair.key()?;
    let listener = TcpListener::bind(args.listen).map_err(|source| VmmError::Listen { addr: args.listen, source })?;
    // The control socket answers from now on: what it answers changes as
    // the backup goes from waiting to following.
    let answer: Arc<RwLock<Answer>> = Arc::new(RwLock::new(Box::new(waiting_status(args.listen))));
    let status_socket = match &args.control {
        Some(path) => {
            let answer = answer.clone();
            // No console while following: attaching is refused until the
            // VM goes live here (then the live loop's socket has one,
            // which shows first what the replay showed, in lockstep and
            // epoch mode).
            let console = crate::attach::ConsoleHub::default();
            Some(control::serve(path, events.clone(), console, move |request| (answer.read().unwrap())(request))?)
        }
        None => None,
    };
    eprintln!("ftvm: backup waiting for the primary on {}", args.listen);
    events.emit(PairEvent::Listening { address: args.listen.to_string() });
    let refused = {
        let events = events.clone();
        move |peer: SocketAddr, why: HandshakeError| {
            eprintln!("ftvm: refused a connection from {peer}: {why}; still waiting for the primary");
            events.emit(PairEvent::StrangerRefused { peer: peer.to_string(), reason: why.to_string() });
        }
    };
    let receiver = Arc::new(LogReceiver::accept(&listener, DEFAULT_BUFFER, &key, refused)?);
    drop(listener);
    let primary = receiver.peer();
    let (failed_tx, failed_rx) = mpsc::channel();
    let failed_tx = Mutex::new(failed_tx);
    // The header is acknowledged only once the backup knows it can follow.
    receiver.hold_acks();
    receiver.start(timing, move |f| {
        let _ = failed_tx.lock().unwrap().send((f, Instant::now()));
    })?;
    receiver.delay_acks(Duration::from_millis(args.ack_delay));
    // The arbiter runs beside the replay, which goes on draining the log.
    // Until the header has named the pair's generation there is nothing
    // to take over: a failure then just ends the log.
    let generation: Arc<OnceLock<u64>> = Arc::default();
    let decision: Arc<Mutex<Option<(Decision, Instant)>>> = Arc::default();
    {
        let (receiver, decision, generation) = (receiver.clone(), decision.clone(), generation.clone());
        let events = events.clone();
        let store = store.clone();
        let isolation = args.pair.isolation()?;
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
            // The replay takes in what was received first: what it had
            // received when the stream was cut may be what makes it
            // ready to take over (a running VM's machine, a first
            // checkpoint), which the primary counted on once its bytes
            // were acknowledged.
            let consumed = receiver.wait_consumed();
            let generation = generation.get().copied();
            if generation.is_some() && !consumed {
                return;
            }
            eprintln!("ftvm: the primary is declared failed: {failure}");
            events.emit(PairEvent::DeclaredFailed { who: "primary".into(), reason: failure.to_string() });
            if let Some(generation) = generation {
                let me = format!("backup on {}", hostname());
                let arbiter = Arbiter::new(store, generation).with_isolation(isolation);
                let d = match arbiter.go_live(&me, |n| events.arbiter_note(n)) {
                    Verdict::Won => {
                        events.emit(PairEvent::ArbiterWon { generation });
                        Decision::GoLive(format!("won generation {generation} at the arbiter"))
                    }
                    Verdict::Lost(who) => {
                        events.emit(PairEvent::ArbiterLost { generation, winner: who.clone() });
                        Decision::Halt(Deposed { who, generation })
                    }
                };
                *decision.lock().unwrap() = Some((d, detected));
            }
            receiver.end_log();
        });
    }
    let (reader, header) = LogReader::open(receiver.pipe()).map_err(|source| VmmError::NoHeader { primary, source })?;
    // Everything the backup checks before it acknowledges the header; the
    // primary waits for that acknowledgement before its VM starts, and
    // hears the reason if the backup refuses.
    let refuse = |reason: ProtectionError| {
        let why = reason.to_string();
        receiver.refuse(&why);
        events.emit(PairEvent::RefusingToFollow { reason: why });
        VmmError::Refused { primary, reason }
    };
    let pair = PairHeader::read(&header).map_err(|e| refuse(e.into()))?;
    let gen = pair.generation;
    let here = ftvm_protection::pair::host_identity(args.pair.host_id.as_deref());
    if pair.host == here {
        return Err(refuse(ProtectionError::SameHost(here)));
    }
    Arbiter::check_storage(&*store, gen, &pair.storage_token)
        .map_err(|e| refuse(ProtectionError::OtherStorage(e.to_string())))?;
    let ram = ftvm_replay::replayer::header_ram(&header).map_err(|e| refuse(e.into()))?;
    if let Some(host) = ftvm_host::memory::capacity().filter(|&host| ram > host) {
        return Err(refuse(ProtectionError::TooLarge { ram, host }));
    }
    let nics = header_nics(&header).map_err(&refuse)?;
    if nets.len() < nics {
        return Err(refuse(ProtectionError::NicNotGiven { nics, given: nets.len() }));
    }
    let local = LocalFiles {
        disks: args.disks.clone(),
        shared: args.pair.shared.clone(),
        start_files: args.start_files.iter().cloned().chain(default_image_files()).collect(),
    };
    // Heartbeats from now on: the checks below may take a while (hashing
    // disks), and the primary must not take them for a failure.
    receiver.add_heartbeat(Heartbeat::start(
        SocketAddr::new(args.listen.ip(), args.pair.heartbeat_port),
        SocketAddr::new(primary.ip(), args.pair.heartbeat_port),
        gen,
        receiver.timing(),
        &key,
    )?);
    // With separate disks the backup asks for the blocks its copies lack.
    let request = |digests: Vec<u8>| receiver.request(digests).map_err(|e| PeerError::from(e).into());
    let prepared: Result<Box<dyn Backup>, ProtectionError> = match pair.mode {
        ModeSetting::Checkpoint { interval_ms } => {
            CheckpointBackup::prepare(reader.into_input(), &header, &pair, interval_ms, &local, &request, &events)
                .map(|b| Box::new(b) as Box<dyn Backup>)
        }
        ModeSetting::Lockstep | ModeSetting::Epoch(_) => {
            ReplayBackup::prepare(reader, &header, &pair, &local, &request, &events, args.show_console)
                .map(|b| Box::new(b) as Box<dyn Backup>)
        }
    };
    let mut backup = prepared.map_err(refuse)?;
    if backup.ready_to_take_over() {
        let _ = generation.set(gen);
    }
    // The VM's CPU limit as its primary last sent it (0: none): its VM
    // runs under it once it goes live.
    let cpu_limit = Arc::new(AtomicU8::new(0));
    *answer.write().unwrap() = Box::new(following_status(receiver.clone(), backup.progress(), gen, cpu_limit.clone()));
    if pair.epoch_mode().is_some() {
        // It waits for log at every epoch end, microseconds apart.
        receiver.short_waits();
    }
    // The TAPs now, while the backup follows: a TAP forwards only some
    // milliseconds after it is opened, and opened when going live that
    // wait would be the clients' (a handover's pause, a failover's). One
    // that cannot be opened now is opened (or refused) when going live.
    let taps = replay::live_backends(&header, &nets, &[]).map_or_else(|_| Vec::new(), |b| HostIo::open_taps(&b));
    receiver.ready();
    let doing =
        if matches!(pair.mode, ModeSetting::Checkpoint { .. }) { "committing checkpoints" } else { "replaying" };
    eprintln!("ftvm: backup of the VM at {primary} (generation {gen}), {doing}");
    events.emit(PairEvent::Following { primary: primary.to_string(), generation: gen, mode: pair.mode.mode() });
    let outcome = backup.follow(&mut |report| match report {
        Report::Executed(n) => receiver.set_executed(n),
        Report::ReadyToTakeOver => {
            let _ = generation.set(gen);
        }
        Report::Control(ControlEntry::Timeout(timeout)) => {
            receiver.follow_timeout(timeout);
            eprintln!("ftvm: the primary set the pair's failure timeout to {} ms", timeout.as_millis());
            events.emit(PairEvent::TimeoutChanged { timeout_ms: timeout.as_millis() as u64 });
        }
        Report::Control(ControlEntry::CpuLimit(percent)) => {
            cpu_limit.store(if percent < 100 { percent } else { 0 }, Ordering::Relaxed);
            eprintln!("ftvm: the primary set the VM's CPU limit to {percent} % of a host core");
            events.emit(PairEvent::CpuLimitChanged { percent });
        }
    });
    receiver.reading_done();
    let followed = match outcome {
        Ok(followed) => followed,
        Err(divergence) => {
            // The replica is wrong: it must never go live. The primary
            // sees the channel close and goes on alone.
            receiver.end_log();
            return Err(VmmError::CannotFollow(divergence));
        }
    };
    let me = format!("backup on {}", hostname());
    // `failed`: the primary failed (rather than handed over), so what it
    // released last may not have reached anyone: sent again.
    let go_live = |backup: Box<dyn Backup>, taps: Vec<Tap>, why: &str, since: Duration, failed: bool| {
        let started = Instant::now();
        let TakeOver { machine, disks, checkpoint, epoch_inputs, resend, undelivered, activation, console } =
            backup.take_over(why, since, gen, &me)?;
        tracing::debug!(take_over_us = started.elapsed().as_micros() as u64, "going live: the machine taken over");
        let resend = if failed { resend } else { Vec::new() };
        events.emit(PairEvent::GoingLive {
            instruction: machine.icount(),
            checkpoint,
            epoch_inputs: epoch_inputs.map(|(all, _)| all),
            epoch_inputs_at_multiples: epoch_inputs.map(|(_, at_multiples)| at_multiples),
            segments_sent_again: resend.len() as u64,
            frames_given: undelivered.len() as u64,
        });
        drop(status_socket);
        receiver.stop_heartbeat();
        let control = args.control.clone();
        let setup = LiveSetup {
            control,
            nets,
            disks,
            announce: true,
            resend,
            undelivered,
            console_shown: console,
            console_input: false,
            events: events.clone(),
            cpu_limit: Some(cpu_limit.load(Ordering::Relaxed)).filter(|&p| p > 0),
        };
        let receiver = receiver.clone();
        let header = header.clone();
        Ok(Outcome::Live(Box::new(GoingLive { machine, activation, header, setup, taps, receiver })))
    };
    match followed {
        Followed::HandedOver => {
            let received = Instant::now();
            eprintln!("ftvm: the primary at {primary} handed the VM over; taking it over");
            events.emit(PairEvent::HandOverReceived { primary: primary.to_string(), generation: gen });
            // The primary stopped its guest and waits for this claim: no
            // failure to confirm, and no isolation check, which could only
            // delay it. The thread that watches for a failure may claim
            // too, when the primary's channel closes first: for the same
            // side, under the same name.
            let arbiter = Arbiter::new(store.clone(), gen);
            let verdict = arbiter.go_live(&me, |n| events.arbiter_note(n));
            tracing::debug!(claim_us = received.elapsed().as_micros() as u64, "handover: claimed at the arbiter");
            match verdict {
                Verdict::Lost(who) if who != me => {
                    events.emit(PairEvent::ArbiterLost { generation: gen, winner: who.clone() });
                    let deposed = Deposed { who, generation: gen };
                    events.emit(PairEvent::Halting { reason: deposed.to_string() });
                    Err(VmmError::PrimaryWon(deposed))
                }
                _ => {
                    events.emit(PairEvent::ArbiterWon { generation: gen });
                    let why = format!("handed over; won generation {gen} at the arbiter");
                    go_live(backup, taps, &why, received.elapsed(), false)
                }
            }
        }
        Followed::Ended(status) => {
            eprintln!(
                "ftvm: the primary ended the VM ({}){}; the backup stops",
                status.map_or("stopped".to_string(), |s| format!("powered off with status {s}")),
                backup.summary()
            );
            events.emit(PairEvent::VmEnded { status });
            Ok(Outcome::Ended(status))
        }
        Followed::Cut(unusable) => {
            let decided = decision.lock().unwrap().take();
            match decided {
                Some((Decision::GoLive(why), detected)) => go_live(backup, taps, &why, detected.elapsed(), true),
                Some((Decision::Halt(deposed), _)) => {
                    events.emit(PairEvent::Halting { reason: deposed.to_string() });
                    Err(VmmError::PrimaryWon(deposed))
                }
                None => Err(VmmError::NothingToTakeOver(unusable)),
            }
        }
    }
}

/// What the control socket answers while the VM is not live here.
type Answer = Box<dyn Fn(Request) -> Response + Send + Sync>;

/// The control socket's answers while the backup waits for a primary on
/// `listen`: only `status`.
fn waiting_status(listen: SocketAddr) -> impl Fn(Request) -> Response + Send + Sync {
    move |request| {
        if request != Request::Status {
            return Response::Error(ControlError::BackupAnswersStatusOnly);
        }
        let status = VmStatus {
            state: RunState::Waiting { listen },
            icount: 0,
            guest_time_s: None,
            pair: None,
            cpu_limit_percent: None,
        };
        Response::Ok(Reply::Status(Box::new(status)))
    }
}

/// The control socket's answers while the backup follows: only `status`
/// (the VM is the primary's to stop, pause or snapshot). `progress` tells
/// how far it is.
fn following_status(
    receiver: Arc<LogReceiver>,
    progress: Arc<dyn Fn() -> Progress + Send + Sync>,
    generation: u64,
    cpu_limit: Arc<AtomicU8>,
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
        let Progress { icount, mode } = progress();
        let state = match (&mode, receiver.failure()) {
            (_, Some(_)) => RunState::TakingOver,
            (BackupMode::Checkpoint { .. }, None) => RunState::Following,
            (BackupMode::Lockstep { .. } | BackupMode::Epoch { .. }, None) => RunState::Replaying,
        };
        let backup = BackupStatus {
            primary: receiver.peer().to_string(),
            generation,
            mode,
            log_mbit_s: rate.2,
            received,
            buffered: receiver.buffered() as u64,
            timeout_ms: receiver.timing().get().timeout.as_millis() as u64,
            heartbeat_timeout_ms: receiver.heartbeat_timeout().as_millis() as u64,
        };
        let status = VmStatus {
            state,
            icount,
            guest_time_s: None,
            pair: Some(PairStatus::Backup(backup)),
            cpu_limit_percent: Some(cpu_limit.load(Ordering::Relaxed)).filter(|&p| p > 0),
        };
        Response::Ok(Reply::Status(Box::new(status)))
    }
}

/// The firmware, kernel and initrd of every image this host has built
/// (the default one first): the files a primary booted from by default,
/// or with `--image NAME`.
fn default_image_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> =
        ftvm_image::locate().map_or_else(|_| Vec::new(), |img| vec![img.firmware, img.kernel, img.initrd]);
    for info in ftvm_image::list().into_iter().filter(|i| i.name != ftvm_image::IMAGE_NAME) {
        if let Ok(img) = ftvm_image::locate_named(&info.name) {
            files.extend([img.firmware, img.kernel, img.initrd]);
        }
    }
    files
}

/// How many NICs the VM a header describes has.
fn header_nics(h: &ftvm_replay::Header) -> Result<usize, ProtectionError> {
    let backends = ftvm_replay::replayer::field(h, "backends")?;
    Ok(backends.split(';').filter(|b| b.starts_with("tap ")).count())
}
