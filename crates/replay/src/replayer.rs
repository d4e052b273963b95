//! Replaying: a machine rebuilt from a log's header and driven by its
//! records, each at its instruction count, with no host I/O.
//!
//! The machine is rebuilt from the header (the same firmware, kernel and
//! initrd, checked by hash, or the same snapshot) and must reach the
//! recorded starting state. Then each entry is applied at its instruction
//! count: inputs are injected, state digests compared. Requests the
//! machine makes of the host are regenerated and handed to a [`ReplayIo`],
//! which by default drops them: a replay sends nothing and writes no disk.
//! `ftvm replay` and a lockstep or epoch backup both replay with this.

use crate::recorder::{parse_device, DeviceTextError};
use crate::{Entry, Header, LogError, LogReader};
use ftvm_machine::snapshot_file::{self, SnapshotFormatError};
use ftvm_machine::{
    DeterministicEngine, Event, Extensions, IoCompletion, IoRequest, Machine, MachineConfig, MachineError, RunExit,
};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The error a [`ReplayIo`] or [`FrameRule`] gives: each implementation
/// (a backup's disks, epoch mode's rule) has its own typed error, boxed
/// here so the replay loop stays generic over them.
pub type HookError = Box<dyn std::error::Error + Send + Sync>;

/// Why a replay stopped short of the recording's end.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("replay diverged{0}")]
    Diverged(Divergence),
    /// The replay's I/O (a backup's own disk reads and writes) failed.
    #[error("{0}")]
    Io(#[source] HookError),
    /// The log broke the replication mode's rule.
    #[error("{0}")]
    Rule(#[source] HookError),
    /// A control entry its user could not take.
    #[error("{0}")]
    Control(#[source] HookError),
}

/// Where and how the replay left the recording.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Divergence {
    /// An entry lies inside a stretch the rule let the replay run ahead
    /// through.
    EntryInsideRunAhead { entry: u64, ran_to: u64 },
    /// A state digest differs: the names of the parts that differ.
    State { icount: u64, check: u64, parts: Vec<String>, since_previous: bool },
    /// The machine stopped before the next entry.
    StoppedEarly { icount: u64, exit: RunExit, next: u64 },
    /// The recording and the replay ended differently.
    End { icount: u64, recorded: Option<u32>, replayed: Option<u32> },
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Divergence::EntryInsideRunAhead { entry, ran_to } => write!(
                f,
                ": the log has an entry at instruction {entry}, inside the epoch the replay ran on to {ran_to}"
            ),
            Divergence::State { icount, check, parts, since_previous } => write!(
                f,
                " at instruction {icount} (state check {check}): {} differ{}",
                parts.join(", "),
                if *since_previous { " since the previous check" } else { "" }
            ),
            Divergence::StoppedEarly { icount, exit, next } => write!(
                f,
                " at instruction {icount}: the machine stopped ({exit:?}) before the next log entry at {next}"
            ),
            Divergence::End { icount, recorded, replayed } => write!(
                f,
                " at the end, instruction {icount}: the recording ended with {recorded:?}, the replay with {replayed:?}"
            ),
        }
    }
}

/// Why a log's header does not give a machine.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    #[error("the header has no '{0}'")]
    Missing(&'static str),
    #[error("unreadable '{0}' in the header")]
    Unreadable(&'static str),
    #[error("unreadable machine '{0}' in the header")]
    UnreadableMachine(String),
    #[error("the header names no {0}")]
    NoFile(&'static str),
    #[error("the recorded machine has the CPU extension '{0}', which this ftvm does not implement")]
    Extension(String),
    #[error("cannot read the recorded {key} {}: {source}", .path.display())]
    Read { key: &'static str, path: PathBuf, source: std::io::Error },
    #[error("the {key} {} is not the one recorded (its hash differs)", .path.display())]
    NotRecorded { key: &'static str, path: PathBuf },
    /// None of the files this host offers is the one the header names.
    #[error(
        "this host has no copy of the {key} {name} (hash {hash}): put it on the shared storage or give it with --start-file"
    )]
    NoLocalCopy { key: &'static str, name: String, hash: String },
    #[error(transparent)]
    Device(#[from] DeviceTextError),
    #[error(transparent)]
    Snapshot(#[from] SnapshotFormatError),
    #[error(transparent)]
    Machine(#[from] MachineError),
    #[error("the machine built from the header is not in the recorded start state")]
    NotInStartState,
    /// The machine comes in the stream after the header, not from files.
    #[error("the header's machine is streamed after it, not built from files")]
    Streamed,
}

/// The seed's text from its header value (hex, as `recorder::hex` writes it).
fn unhex_text(value: &str) -> Result<String, HeaderError> {
    let bad = || HeaderError::Unreadable("seed");
    if !value.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes = (0..value.len())
        .step_by(2)
        .map(|i| value.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()).ok_or_else(bad))
        .collect::<Result<Vec<u8>, _>>()?;
    String::from_utf8(bytes).map_err(|_| bad())
}

/// How a replay ended, short of a divergence.
pub enum Outcome {
    /// The recording's end entry: the guest powered off with this status,
    /// or the recorder stopped.
    Ended(Option<u32>),
    /// The recording's hand-over entry: the VM goes on from here, on this
    /// side (the machine stands where the primary stopped it).
    HandedOver,
    /// The log stopped short (cut, corrupt, or a primary gone): the machine
    /// is at the last go-live point.
    Cut(LogError),
}

/// What a replay does with the requests the machine regenerates, and
/// with the logged completions it injects. A plain replay sends and
/// writes nothing ([`Regenerate`]); a backup may execute its disk I/O
/// itself (VMware FT §4.1 and §4.2).
pub trait ReplayIo {
    /// Requests the machine made, in order, by the time it reached `icount`.
    fn requests(&mut self, icount: u64, requests: Vec<(usize, IoRequest)>) -> Result<(), HookError>;
    /// A completion from the log, about to be injected into `slot`.
    fn completion(&mut self, slot: usize, completion: &mut IoCompletion) -> Result<(), HookError>;
}

/// Outputs are regenerated, never sent; completions come whole from the log.
pub struct Regenerate;

impl ReplayIo for Regenerate {
    fn requests(&mut self, _: u64, _: Vec<(usize, IoRequest)>) -> Result<(), HookError> {
        Ok(())
    }
    fn completion(&mut self, _: usize, _: &mut IoCompletion) -> Result<(), HookError> {
        Ok(())
    }
}

/// A rule of the replication mode that a log must keep beyond what
/// determinism checks, and that lets the replay run ahead of its last
/// frame. Epoch mode has one (Bressoud & Schneider: every input at an
/// epoch end, and the backup runs each epoch while the primary does);
/// a recording or lockstep log has none ([`NoRule`]).
pub trait FrameRule {
    /// With a whole frame taken and the machine at `icount`, where it may
    /// run on to before the next frame comes (None: not past the frame).
    fn run_ahead_to(&self, icount: u64) -> Option<u64>;
    /// An input from the log is about to be applied where `m` stands:
    /// an error if the log breaks the rule there.
    fn input(&mut self, m: &dyn DeterministicEngine) -> Result<(), HookError>;
    /// What the rule saw, for the last words ("" for nothing).
    fn summary(&self) -> String {
        String::new()
    }
    /// The inputs it checked, and of them those where the rule held by
    /// its main case (epoch mode: at a multiple of the epoch length, not
    /// where the guest idled); None for no rule.
    fn inputs_checked(&self) -> Option<(u64, u64)> {
        None
    }
}

/// No rule beyond determinism.
pub struct NoRule;

impl FrameRule for NoRule {
    fn run_ahead_to(&self, _icount: u64) -> Option<u64> {
        None
    }
    fn input(&mut self, _m: &dyn DeterministicEngine) -> Result<(), HookError> {
        Ok(())
    }
}

#[derive(Default)]
pub struct Replayed {
    /// State digests checked and matched.
    pub digests: u64,
}

/// Applies every record of `reader` to `m`, each at its instruction count;
/// `progress` hears the instruction count after each, and that of the last
/// go-live point received (the machine never runs past it: a record is
/// handed out only with its whole frame). `control` takes each control
/// entry where it lies; `console`, what the guest shows on its console as
/// it goes. A divergence from the recording is an error.
#[allow(clippy::too_many_arguments)]
pub fn replay_log<R: std::io::Read>(
    reader: &mut LogReader<R>,
    m: &mut dyn DeterministicEngine,
    io: &mut dyn ReplayIo,
    console: &mut dyn FnMut(&[u8]),
    replayed: &mut Replayed,
    rule: &mut dyn FrameRule,
    control: &mut dyn FnMut(&[u8]) -> Result<(), HookError>,
    mut progress: impl FnMut(u64, u64),
) -> Result<Outcome, ReplayError> {
    let mut took_a_frame = false;
    loop {
        let ahead = if took_a_frame && reader.frame_done() { rule.run_ahead_to(m.icount()) } else { None };
        if let Some(end) = ahead {
            // P5: with the last end's frame taken, the backup runs the
            // epoch that began there while the primary runs it, and waits
            // for the end's frame only at the end: no record can lie
            // inside an epoch, and the primary logs no second end where
            // it logged one (unless idle, where neither side runs on).
            // Where the machine stops short (idle, powered off) the
            // record will say the same, or the run to it will find the
            // divergence.
            run_toward(m, io, end, console, &mut |i| progress(i, reader.last_go_live()))?;
            progress(m.icount(), reader.last_go_live());
        }
        let rec = match reader.next_record() {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(Outcome::Ended(None)),
            Err(e) => {
                show(m, console);
                return Ok(Outcome::Cut(e));
            }
        };
        took_a_frame = true;
        if rec.icount < m.icount() {
            return Err(ReplayError::Diverged(Divergence::EntryInsideRunAhead {
                entry: rec.icount,
                ran_to: m.icount(),
            }));
        }
        let end = reader.last_go_live();
        let powered_off = run_to(m, io, rec.icount, console, &mut |i| progress(i, end))?;
        progress(m.icount(), end);
        match rec.entry {
            Entry::Event(mut ev) => {
                rule.input(m).map_err(ReplayError::Rule)?;
                if let Event::Io { slot, completion } = &mut ev {
                    io.completion(*slot, completion).map_err(ReplayError::Io)?;
                }
                m.inject(ev);
            }
            Entry::StateHash(recorded) => {
                let mine = m.state_digest();
                if mine != recorded {
                    return Err(ReplayError::Diverged(Divergence::State {
                        icount: m.icount(),
                        check: replayed.digests + 1,
                        parts: mine.differences(&recorded, &m.digest_part_names()),
                        since_previous: replayed.digests != 0,
                    }));
                }
                replayed.digests += 1;
            }
            Entry::GoLive => {}
            Entry::Control(payload) => control(&payload).map_err(ReplayError::Control)?,
            Entry::HandOver => {
                show(m, console);
                return Ok(Outcome::HandedOver);
            }
            Entry::End(status) => {
                if powered_off != status {
                    return Err(ReplayError::Diverged(Divergence::End {
                        icount: m.icount(),
                        recorded: status,
                        replayed: powered_off,
                    }));
                }
                show(m, console);
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
    m: &mut dyn DeterministicEngine,
    io: &mut dyn ReplayIo,
    icount: u64,
    console: &mut dyn FnMut(&[u8]),
    progress: &mut dyn FnMut(u64),
) -> Result<Option<u32>, ReplayError> {
    match run_toward(m, io, icount, console, progress)? {
        RunExit::Reached => Ok(None),
        RunExit::PowerOff(code) if m.icount() == icount => Ok(Some(code)),
        exit => Err(ReplayError::Diverged(Divergence::StoppedEarly { icount: m.icount(), exit, next: icount })),
    }
}

/// Runs toward `target`, handing the machine's requests to `io` and
/// telling `progress` its instruction count on the way; returns the exit
/// it stopped with (`Reached` only at `target`).
fn run_toward(
    m: &mut dyn DeterministicEngine,
    io: &mut dyn ReplayIo,
    target: u64,
    console: &mut dyn FnMut(&[u8]),
    progress: &mut dyn FnMut(u64),
) -> Result<RunExit, ReplayError> {
    loop {
        let exit = m.run_until(target.min(m.icount().saturating_add(PROGRESS_EVERY)));
        io.requests(m.icount(), m.take_io_requests()).map_err(ReplayError::Io)?;
        show(m, console);
        match exit {
            RunExit::Io => continue,
            RunExit::Reached if m.icount() < target => progress(m.icount()),
            other => return Ok(other),
        }
    }
}

fn show(m: &mut dyn DeterministicEngine, console: &mut dyn FnMut(&[u8])) {
    let out = m.take_console_output();
    if !out.is_empty() {
        console(&out);
    }
}

/// A `console` for [`replay_log`] that writes what the guest shows to
/// stdout if `on` (and drops it otherwise).
pub fn to_stdout(on: bool) -> impl FnMut(&[u8]) {
    move |out| {
        if on {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(out);
            let _ = o.flush();
        }
    }
}

/// A header field that must be there.
pub fn field<'a>(h: &'a Header, key: &'static str) -> Result<&'a str, HeaderError> {
    h.get(key).ok_or(HeaderError::Missing(key))
}

/// Where the files a header names (firmware, kernel, initrd, snapshot:
/// each by its hash and the path it had where it was recorded) are read
/// from. A log of this host's own reads them where they were; a backup
/// reads only files its own host offers, never a path a peer sent.
pub trait FileFinder {
    /// The bytes of the file recorded for `key` at `recorded`, whose
    /// BLAKE3 hash is `hash`.
    fn find(&self, key: &'static str, hash: &str, recorded: &Path) -> Result<Vec<u8>, HeaderError>;
}

/// The files where the header says they were: for a log this host wrote
/// or was handed by its user (`ftvm replay`).
pub struct AtRecordedPaths;

impl FileFinder for AtRecordedPaths {
    fn find(&self, key: &'static str, hash: &str, recorded: &Path) -> Result<Vec<u8>, HeaderError> {
        let path = recorded.to_path_buf();
        let bytes = std::fs::read(&path).map_err(|source| HeaderError::Read { key, path: path.clone(), source })?;
        if blake3::hash(&bytes).to_hex().as_str() != hash {
            return Err(HeaderError::NotRecorded { key, path });
        }
        Ok(bytes)
    }
}

/// Reads the file a header field names ("HASH PATH") through `files`.
fn checked_file(h: &Header, key: &'static str, files: &dyn FileFinder) -> Result<Option<Vec<u8>>, HeaderError> {
    let v = field(h, key)?;
    if v == "none" {
        return Ok(None);
    }
    let (hash, path) = v.split_once(' ').ok_or(HeaderError::Unreadable(key))?;
    files.find(key, hash, Path::new(path)).map(Some)
}

/// The machine a header names, built from the files `files` finds and
/// checked to be in the recorded start state, ready to replay: with its
/// dirty pages tracked (the state digests hash the pages written).
pub fn start_machine(h: &Header, files: &dyn FileFinder) -> Result<Machine, HeaderError> {
    let mut m = machine_from_header(h, files)?;
    m.set_dirty_tracking(true);
    if field(h, "state")? != crate::recorder::hex(&m.state_hash()) {
        return Err(HeaderError::NotInStartState);
    }
    Ok(m)
}

/// Whether the header's machine comes in the stream after it (a running
/// VM given a backup) rather than from files.
pub fn is_streamed(h: &Header) -> bool {
    h.get("start") == Some(crate::recorder::STREAMED)
}

/// The guest RAM, in bytes, of the machine a header names (to check
/// before building it).
pub fn header_ram(h: &Header) -> Result<u64, HeaderError> {
    machine_number(h, "ram")
}

/// A number of the header's machine line (`harts`, `ram`, `ips`,
/// `rtc_base_ns`), as `key=N`.
pub fn machine_number(h: &Header, key: &str) -> Result<u64, HeaderError> {
    let machine = field(h, "machine")?;
    machine
        .split(' ')
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| HeaderError::UnreadableMachine(machine.to_string()))
}

/// The machine a log's header names, built in its starting state from
/// the files `files` finds.
pub fn machine_from_header(h: &Header, files: &dyn FileFinder) -> Result<Machine, HeaderError> {
    if is_streamed(h) {
        return Err(HeaderError::Streamed);
    }
    let machine = field(h, "machine")?;
    let num = |key: &str| machine_number(h, key);
    // The optional CPU extensions: the device tree advertised them to the
    // guest and the harts executed them, so the replay has exactly these.
    // A header without them is from a build before them: none.
    let extensions = match machine.split(' ').find_map(|kv| kv.strip_prefix("ext=")) {
        Some(text) => Extensions::parse(text).map_err(HeaderError::Extension)?,
        None => Extensions::NONE,
    };
    if field(h, "start")? == "snapshot" {
        let bytes = checked_file(h, "snapshot", files)?.ok_or(HeaderError::NoFile("snapshot"))?;
        let snap = snapshot_file::decode(&bytes)?;
        let mut m = Machine::restore(&snap.machine)?;
        // The recording host may have set the restored RTC to its clock.
        m.set_rtc_base_ns(num("rtc_base_ns")?);
        return Ok(m);
    }
    let devices = field(h, "devices")?;
    let devices = if devices.is_empty() {
        Vec::new()
    } else {
        devices.split(';').map(parse_device).collect::<Result<Vec<_>, _>>()?
    };
    let cfg = MachineConfig {
        harts: num("harts")? as usize,
        ram_size: num("ram")?,
        firmware: checked_file(h, "firmware", files)?,
        kernel: checked_file(h, "kernel", files)?.ok_or(HeaderError::NoFile("kernel"))?,
        initrd: checked_file(h, "initrd", files)?,
        cmdline: field(h, "cmdline")?.to_string(),
        seed: h.get("seed").map(unhex_text).transpose()?,
        devices,
        guest_ips: num("ips")?,
        rtc_base_ns: num("rtc_base_ns")?,
        extensions,
    };
    Ok(Machine::new(&cfg)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recorder::{header, hex, Start};

    /// A bare-metal program: `j .` (it never runs; the machine's start
    /// state is what is checked).
    const PROGRAM: [u8; 4] = 0x0000_006fu32.to_le_bytes();

    struct Kernel;
    impl FileFinder for Kernel {
        fn find(&self, _key: &'static str, _hash: &str, _recorded: &Path) -> Result<Vec<u8>, HeaderError> {
            Ok(PROGRAM.to_vec())
        }
    }

    fn seeded_header(seed: &str) -> Header {
        let cfg = MachineConfig { seed: Some(seed.into()), ..MachineConfig::bare_metal(PROGRAM.to_vec(), 16 << 20) };
        let m = Machine::new(&cfg).unwrap();
        let start = Start::Boot {
            firmware: None,
            kernel: (Path::new("program"), &PROGRAM),
            initrd: None,
            cmdline: "",
            seed: cfg.seed.as_deref(),
        };
        header(&m, cfg.ram_size, cfg.guest_ips, "", start)
    }

    /// The seed (lines, in the device tree the machine starts with) comes
    /// back from the header: the replay's or the backup's machine starts
    /// in the recorded state, which it would not without it.
    #[test]
    fn the_seed_travels_in_the_header() {
        let seed = "hostname=db1\nssh-key=ssh-ed25519 AAAAC3Nz root@host\n";
        let h = seeded_header(seed);
        start_machine(&h, &Kernel).unwrap();

        let mut lost = h.clone();
        lost.set("seed", hex(b"hostname=other\n"));
        assert!(matches!(start_machine(&lost, &Kernel), Err(HeaderError::NotInStartState)));
        lost.set("seed", "4");
        assert!(matches!(start_machine(&lost, &Kernel), Err(HeaderError::Unreadable("seed"))));
    }
}
