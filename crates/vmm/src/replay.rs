//! `ftvm replay`: re-executes a recorded VM from its log with no host I/O.
//!
//! The machine is rebuilt from the log's header (the same firmware, kernel
//! and initrd, checked by hash, or the same snapshot) and must reach the
//! recorded starting state. Then each entry is applied at its instruction
//! count: inputs are injected, state digests compared. Requests the
//! machine makes of the host are regenerated and dropped: a replay sends
//! nothing and writes no disk. At the end, or at the last go-live point of
//! a cut log, `--then-run` hands the machine over to live execution, which
//! is what a backup does when it goes live.

use crate::ft::epoch::backup::EpochCheck;
use crate::host_io::{self, HostEvent, HostIo};
use crate::record::{hex, parse_device};
use crate::{console, control, live};
use clap::Args;
use ftvm_machine::{snapshot_file, Event, IoCompletion, IoRequest, Machine, MachineConfig, RunExit};
use ftvm_replay::{Entry, Header, LogReader};
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct ReplayArgs {
    /// The log written by `ftvm record`.
    #[arg(long, value_name = "FILE")]
    log: PathBuf,
    /// Show the guest's console output as it is regenerated.
    #[arg(long)]
    show_console: bool,
    /// At the end of the log (or its last go-live point), go on running
    /// live with the recorded disks and TAPs.
    #[arg(long)]
    then_run: bool,
    /// With --then-run: the control socket of the live VM.
    #[arg(long, value_name = "PATH", requires = "then_run")]
    control: Option<PathBuf>,
}

pub fn replay(args: &ReplayArgs) -> Result<u32, String> {
    let name = args.log.display().to_string();
    let file = std::fs::File::open(&args.log).map_err(|e| format!("cannot open log {name}: {e}"))?;
    let (mut reader, header) =
        LogReader::open(std::io::BufReader::with_capacity(1 << 20, file)).map_err(|e| format!("log {name}: {e}"))?;
    let mut m = machine_from_header(&header).map_err(|e| format!("log {name}: {e}"))?;
    m.set_dirty_tracking(true);
    let want = header.get("state").ok_or_else(|| format!("log {name}: the header has no start state"))?;
    if hex(&m.state_hash()) != want {
        return Err(format!("log {name}: the machine built from its header is not in the recorded start state"));
    }
    let started = std::time::Instant::now();
    let mut replayed = Replayed::default();
    let outcome = replay_log(&mut reader, &mut m, &mut Regenerate, args.show_console, &mut replayed, |_, _| {})?;
    let secs = started.elapsed().as_secs_f64();
    let digests = replayed.digests;
    match outcome {
        Outcome::Ended(status) => {
            eprintln!(
                "ftvm: replayed {} instructions in {secs:.1} s, {digests} state checks matched{}",
                m.icount(),
                status.map_or(String::new(), |s| format!(", the guest powered off with status {s}"))
            );
            match (status, args.then_run) {
                (Some(_), true) => Err("the recording ends with the guest powered off: nothing to run".into()),
                (Some(s), false) => Ok(s),
                (None, true) => go_live(m, &header, &LiveSetup::from_args(args)),
                (None, false) => Ok(0),
            }
        }
        Outcome::Cut(e) => {
            // Without --then-run the error alone is the answer: one line.
            let msg = format!("log {name}: {e}; replayed the valid part to instruction {}", m.icount());
            if args.then_run {
                eprintln!("ftvm: replayed {} instructions in {secs:.1} s, {digests} state checks matched", m.icount());
                eprintln!("ftvm: {msg}; going live there");
                go_live(m, &header, &LiveSetup::from_args(args))
            } else {
                Err(msg)
            }
        }
    }
}

/// How a replay ended, short of a divergence.
pub enum Outcome {
    /// The recording's end entry: the guest powered off with this status,
    /// or the recorder stopped.
    Ended(Option<u32>),
    /// The log stopped short (cut, corrupt, or a primary gone): the machine
    /// is at the last go-live point.
    Cut(ftvm_replay::LogError),
}

/// What a replay does with the requests the machine regenerates, and
/// with the logged completions it injects. A plain replay sends and
/// writes nothing ([`Regenerate`]); a backup may execute its disk I/O
/// itself (VMware FT §4.1 and §4.2).
pub trait ReplayIo {
    /// Requests the machine made, in order, by the time it reached `icount`.
    fn requests(&mut self, icount: u64, requests: Vec<(usize, IoRequest)>) -> Result<(), String>;
    /// A completion from the log, about to be injected into `slot`.
    fn completion(&mut self, slot: usize, completion: &mut IoCompletion) -> Result<(), String>;
}

/// Outputs are regenerated, never sent; completions come whole from the log.
pub struct Regenerate;

impl ReplayIo for Regenerate {
    fn requests(&mut self, _: u64, _: Vec<(usize, IoRequest)>) -> Result<(), String> {
        Ok(())
    }
    fn completion(&mut self, _: usize, _: &mut IoCompletion) -> Result<(), String> {
        Ok(())
    }
}

#[derive(Default)]
pub struct Replayed {
    /// State digests checked and matched.
    pub digests: u64,
    /// In epoch mode: the check that every input falls on an epoch end.
    pub epochs: Option<EpochCheck>,
}

/// Applies every record of `reader` to `m`, each at its instruction count;
/// `progress` hears the instruction count after each, and that of the last
/// go-live point received (the machine never runs past it: a record is
/// handed out only with its whole frame). A divergence from the recording
/// is an error.
pub fn replay_log<R: std::io::Read>(
    reader: &mut LogReader<R>,
    m: &mut Machine,
    io: &mut dyn ReplayIo,
    show_console: bool,
    replayed: &mut Replayed,
    mut progress: impl FnMut(u64, u64),
) -> Result<Outcome, String> {
    let mut took_a_frame = false;
    loop {
        if let (Some(check), true) = (&replayed.epochs, took_a_frame && reader.frame_done()) {
            // P5: with the last end's frame taken, the backup runs the
            // epoch that began there while the primary runs it, and waits
            // for the end's frame only at the end: no record can lie
            // inside an epoch, and the primary logs no second end where
            // it logged one (unless idle, where neither side runs on).
            // Where the machine stops short (idle, powered off) the
            // record will say the same, or the run to it will find the
            // divergence.
            let end = check.mode.next_end(m.icount());
            run_toward(m, io, end, show_console, &mut |i| progress(i, reader.last_go_live()))?;
            progress(m.icount(), reader.last_go_live());
        }
        let rec = match reader.next_record() {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(Outcome::Ended(None)),
            Err(e) => {
                show(m, show_console);
                return Ok(Outcome::Cut(e));
            }
        };
        took_a_frame = true;
        if rec.icount < m.icount() {
            return Err(format!(
                "replay diverged: the log has an entry at instruction {}, inside the epoch the replay ran on to {}",
                rec.icount,
                m.icount()
            ));
        }
        let end = reader.last_go_live();
        let powered_off = run_to(m, io, rec.icount, show_console, &mut |i| progress(i, end))?;
        progress(m.icount(), end);
        match rec.entry {
            Entry::Event(mut ev) => {
                if let Some(check) = &mut replayed.epochs {
                    check.input(m)?;
                }
                if let Event::Io { slot, completion } = &mut ev {
                    io.completion(*slot, completion)?;
                }
                m.inject(ev);
            }
            Entry::StateHash(recorded) => {
                let mine = m.state_digest();
                if mine != recorded {
                    return Err(format!(
                        "replay diverged at instruction {} (state check {}): {} differ{}",
                        m.icount(),
                        replayed.digests + 1,
                        mine.differences(&recorded, &m.digest_part_names()).join(", "),
                        if replayed.digests == 0 { "" } else { " since the previous check" }
                    ));
                }
                replayed.digests += 1;
            }
            Entry::GoLive => {}
            Entry::End(status) => {
                if powered_off != status {
                    return Err(format!(
                        "replay diverged at the end, instruction {}: the recording ended with {:?}, the replay with {:?}",
                        m.icount(),
                        status,
                        powered_off
                    ));
                }
                show(m, show_console);
                return Ok(Outcome::Ended(status));
            }
        }
    }
}

/// Instructions between two reports of progress within one run: entries
/// of a log can be tens of millions of instructions apart (a busy guest
/// logs little more than its keep-alives), and a backup that told the
/// primary its position only at each would look that much further behind
/// (the primary measures the backup's lag on what it is told).
const PROGRESS_EVERY: u64 = 2_000_000;

/// Runs to `icount`, where the next entry applies, telling `progress` its
/// instruction count on the way. The recorded machine was at that
/// instruction when the entry was logged, so stopping early (idle,
/// powered off) means the replay has diverged. Returns the exit status if
/// the guest powers off exactly there.
fn run_to(
    m: &mut Machine,
    io: &mut dyn ReplayIo,
    icount: u64,
    show_console: bool,
    progress: &mut dyn FnMut(u64),
) -> Result<Option<u32>, String> {
    match run_toward(m, io, icount, show_console, progress)? {
        RunExit::Reached => Ok(None),
        RunExit::PowerOff(code) if m.icount() == icount => Ok(Some(code)),
        other => Err(format!(
            "replay diverged at instruction {}: the machine stopped ({other:?}) before the next log entry at {icount}",
            m.icount()
        )),
    }
}

/// Runs toward `target`, handing the machine's requests to `io` and
/// telling `progress` its instruction count on the way; returns the exit
/// it stopped with (`Reached` only at `target`).
fn run_toward(
    m: &mut Machine,
    io: &mut dyn ReplayIo,
    target: u64,
    show_console: bool,
    progress: &mut dyn FnMut(u64),
) -> Result<RunExit, String> {
    loop {
        let exit = m.run_until(target.min(m.icount().saturating_add(PROGRESS_EVERY)));
        io.requests(m.icount(), m.take_io_requests())?;
        show(m, show_console);
        match exit {
            RunExit::Io => continue,
            RunExit::Reached if m.icount() < target => progress(m.icount()),
            other => return Ok(other),
        }
    }
}

fn show(m: &mut Machine, on: bool) {
    let out = m.take_console_output();
    if on && !out.is_empty() {
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(&out);
        let _ = o.flush();
    }
}

fn field<'a>(h: &'a Header, key: &str) -> Result<&'a str, String> {
    h.get(key).ok_or_else(|| format!("the header has no '{key}'"))
}

/// Reads the file a header field names ("HASH PATH") and checks its hash.
fn checked_file(h: &Header, key: &str) -> Result<Option<Vec<u8>>, String> {
    let v = field(h, key)?;
    if v == "none" {
        return Ok(None);
    }
    let (hash, path) = v.split_once(' ').ok_or_else(|| format!("unreadable '{key}' in the header"))?;
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read the recorded {key} {path}: {e}"))?;
    if blake3::hash(&bytes).to_hex().as_str() != hash {
        return Err(format!("the {key} {path} is not the one recorded (its hash differs)"));
    }
    Ok(Some(bytes))
}

pub fn machine_from_header(h: &Header) -> Result<Machine, String> {
    if field(h, "start")? == "snapshot" {
        let bytes = checked_file(h, "snapshot")?.ok_or("the header names no snapshot")?;
        let snap = snapshot_file::decode(&bytes).map_err(|e| e.to_string())?;
        return Machine::restore(&snap.machine).map_err(|e| e.to_string());
    }
    let machine = field(h, "machine")?;
    let num = |key: &str| -> Result<u64, String> {
        machine
            .split(' ')
            .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("unreadable machine '{machine}' in the header"))
    };
    let devices = field(h, "devices")?;
    let devices = if devices.is_empty() {
        Vec::new()
    } else {
        devices.split(';').map(parse_device).collect::<Result<Vec<_>, _>>()?
    };
    let cfg = MachineConfig {
        harts: num("harts")? as usize,
        ram_size: num("ram")?,
        firmware: checked_file(h, "firmware")?,
        kernel: checked_file(h, "kernel")?.ok_or("the header names no kernel")?,
        initrd: checked_file(h, "initrd")?,
        cmdline: field(h, "cmdline")?.to_string(),
        devices,
        guest_ips: num("ips")?,
    };
    Machine::new(&cfg).map_err(|e| e.to_string())
}

/// How long a backup going live waits for the old primary to release the disk.
const DISK_RELEASE_WAIT: Duration = Duration::from_secs(10);

/// What the VM that goes live at the end of a replay gets.
pub struct LiveSetup {
    pub control: Option<PathBuf>,
    /// TAPs to use instead of the recorded ones, in order (the MAC stays).
    pub nets: Vec<(String, Option<String>)>,
    /// Disk images to use instead of the recorded ones, in order.
    pub disks: Vec<PathBuf>,
    /// Announce the NICs' MACs from here (a backup taking over).
    pub announce: bool,
    pub console_input: bool,
}

impl LiveSetup {
    fn from_args(args: &ReplayArgs) -> LiveSetup {
        LiveSetup {
            control: args.control.clone(),
            nets: Vec::new(),
            disks: Vec::new(),
            announce: false,
            console_input: true,
        }
    }
}

/// Continues the replayed machine as a live VM on the recorded backends.
pub fn go_live(m: Machine, h: &Header, setup: &LiveSetup) -> Result<u32, String> {
    let mut backends = host_io::parse_description(&field(h, "backends")?.replace(';', "\n"))?;
    let (mut nets, mut disks) = (setup.nets.iter(), setup.disks.iter());
    for b in backends.iter_mut() {
        match b {
            host_io::Backend::Tap { name, bridge, .. } => {
                if let Some((n, br)) = nets.next() {
                    *name = n.clone();
                    *bridge = br.clone();
                }
            }
            host_io::Backend::Disk { path, .. } => {
                if let Some(p) = disks.next() {
                    *path = p.clone();
                }
            }
            host_io::Backend::Rng => {}
        }
    }
    let (tx, events) = std::sync::mpsc::channel();
    // A backup taking over may find the disk still held by the primary it
    // replaces, which is halting (it lost the arbiter) or dying: give it a
    // moment to let go.
    let patience = Instant::now() + if setup.announce { DISK_RELEASE_WAIT } else { Duration::ZERO };
    let (mut io, devices) = loop {
        match HostIo::open(backends.clone(), tx.clone()) {
            Ok(opened) => break opened,
            Err(e) if e.in_use() && Instant::now() < patience => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(e.to_string()),
        }
    };
    if devices != m.devices() {
        return Err("the recorded disks or NICs are not what the machine had (a disk changed size?)".into());
    }
    if setup.announce {
        io.announce();
    }
    let _control = match &setup.control {
        Some(path) => {
            io.set_control(true);
            Some(control::listen(path, tx.clone())?)
        }
        None => None,
    };
    if setup.console_input {
        console::spawn_reader(tx.clone(), HostEvent::Console);
    }
    drop(tx);
    let opts = live::Options {
        fast_time: false,
        exec: false,
        show_boot: false,
        console_input: setup.console_input,
        paused: false,
        ft_alone: setup.announce,
    };
    live::run(m, io, events, opts, None)
}
