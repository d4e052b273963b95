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

use crate::error::{usage, LogProblem, VmmError};
use crate::ft::protect::MachineProtector;
use crate::host_io::{self, HostEvent, HostIo};
use crate::{console, control, live};
use ftvm_host::tap::Tap;
use ftvm_machine::Machine;
use ftvm_protection::checkpoint::backup::PendingActivation;
use ftvm_protection::error::ProtectionError;
use ftvm_protection::events::Events;
use ftvm_replay::replayer::{field, replay_log, start_machine, AtRecordedPaths, NoRule, Outcome, Regenerate, Replayed};
use ftvm_replay::{Header, LogReader};
use ftvm_replication::fence::Fence;
use std::path::PathBuf;

/// What `ftvm replay` does.
pub struct ReplayConfig {
    /// The log written by `ftvm record`.
    pub log: PathBuf,
    /// Show the guest's console output as it is regenerated.
    pub show_console: bool,
    /// At the end of the log (or its last go-live point), go on running
    /// live with the recorded disks and TAPs.
    pub then_run: bool,
    /// With `then_run`: the control socket of the live VM.
    pub control: Option<PathBuf>,
}

pub fn replay(args: &ReplayConfig) -> Result<u32, VmmError> {
    let name = args.log.display().to_string();
    let bad = |problem: LogProblem| VmmError::Log { name: name.clone(), problem };
    let file = std::fs::File::open(&args.log).map_err(|e| bad(LogProblem::Open(e)))?;
    let (mut reader, header) =
        LogReader::open(std::io::BufReader::with_capacity(1 << 20, file)).map_err(|e| bad(e.into()))?;
    let mut m = start_machine(&header, &AtRecordedPaths).map_err(|e| bad(e.into()))?;
    let started = std::time::Instant::now();
    let mut replayed = Replayed::default();
    let outcome = replay_log(
        &mut reader,
        &mut m,
        &mut Regenerate,
        &mut ftvm_replay::replayer::to_stdout(args.show_console),
        &mut replayed,
        &mut NoRule,
        // A log file's control entries were for the backup it went to.
        &mut |_| Ok(()),
        |_, _| {},
    )?;
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
                (Some(_), true) => Err(usage("the recording ends with the guest powered off: nothing to run")),
                (Some(s), false) => Ok(s),
                (None, true) => go_live(m, &header, &LiveSetup::from_args(args), Vec::new(), None),
                (None, false) => Ok(0),
            }
        }
        // A log that ended in a handover: its VM went on elsewhere; here
        // it ends, or goes on as after a stopped recording.
        Outcome::HandedOver => {
            eprintln!(
                "ftvm: replayed {} instructions in {secs:.1} s, {digests} state checks matched; the VM was handed over there",
                m.icount()
            );
            if args.then_run {
                go_live(m, &header, &LiveSetup::from_args(args), Vec::new(), None)
            } else {
                Ok(0)
            }
        }
        Outcome::Cut(e) => {
            // Without --then-run the error alone is the answer: one line.
            let cut = bad(LogProblem::Cut { source: e, replayed_to: m.icount() });
            if args.then_run {
                eprintln!("ftvm: replayed {} instructions in {secs:.1} s, {digests} state checks matched", m.icount());
                eprintln!("ftvm: {cut}; going live there");
                go_live(m, &header, &LiveSetup::from_args(args), Vec::new(), None)
            } else {
                Err(cut)
            }
        }
    }
}

/// What the VM that goes live at the end of a replay gets.
pub struct LiveSetup {
    pub control: Option<PathBuf>,
    /// TAPs to use instead of the recorded ones, in order (the MAC stays).
    pub nets: Vec<(String, Option<String>)>,
    /// Disk images to use instead of the recorded ones, in order.
    pub disks: Vec<PathBuf>,
    /// Announce the NICs' MACs from here (a backup taking over).
    pub announce: bool,
    /// Frames to send again once announced, as (NIC slot, frame): the
    /// last TCP segments a backup's replay made before its primary failed
    /// (`ftvm_protection::resend`).
    pub resend: Vec<(usize, Vec<u8>)>,
    /// Frames received by the primary that its guest never had, as (NIC
    /// slot, frame): given to the guest first.
    pub undelivered: Vec<(usize, Vec<u8>)>,
    /// What the VM's console showed before it goes live here (a backup's
    /// replay of it): a console attached from now on is shown it first.
    pub console_shown: Vec<u8>,
    pub console_input: bool,
    /// The VM's journal of events (a backup's, which goes on).
    pub events: Events,
    /// The CPU limit the VM runs under (a backup's: its primary's).
    pub cpu_limit: Option<u8>,
}

impl LiveSetup {
    fn from_args(args: &ReplayConfig) -> LiveSetup {
        LiveSetup {
            control: args.control.clone(),
            nets: Vec::new(),
            disks: Vec::new(),
            announce: false,
            resend: Vec::new(),
            undelivered: Vec::new(),
            console_shown: Vec::new(),
            console_input: true,
            events: Events::default(),
            cpu_limit: None,
        }
    }
}

/// The backends a log's header records, slot by slot (the header keeps
/// [`HostIo::describe`]'s lines on one line, `;` between them).
pub fn header_backends(h: &Header) -> Result<Vec<host_io::Backend>, VmmError> {
    host_io::parse_description(&field(h, "backends")?.replace(';', "\n")).map_err(VmmError::Backends)
}

/// The backends a VM goes live on: those of the log's header, with this
/// host's TAPs and disks (`nets`, `disks`, as in [`LiveSetup`]) in their
/// places.
pub fn live_backends(
    h: &Header,
    nets: &[(String, Option<String>)],
    disks: &[PathBuf],
) -> Result<Vec<host_io::Backend>, VmmError> {
    let mut backends = header_backends(h)?;
    let (mut nets, mut disks) = (nets.iter(), disks.iter());
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
    Ok(backends)
}

/// Continues the replayed machine as a live VM on the recorded backends;
/// `taps`: those of them opened ahead (`HostIo::open_taps`).
pub fn go_live(
    m: Machine,
    h: &Header,
    setup: &LiveSetup,
    taps: Vec<Tap>,
    activation: Option<PendingActivation>,
) -> Result<u32, VmmError> {
    let started = std::time::Instant::now();
    let backends = live_backends(h, &setup.nets, &setup.disks)?;
    let (tx, events) = std::sync::mpsc::channel();
    // Live alone: a replay's end, or a backup that won the arbiter. The
    // winner goes live whatever the primary it replaces is doing: that
    // one may still hold the disk's lock (stopped, or halting), but it is
    // fenced, so the disk is taken over rather than waited for.
    // A checkpoint backup's activation records are written while the VM
    // runs: until they are, its frames wait (`HostIo::take_over`).
    let activated = activation.as_ref().map(|_| Fence::leased());
    let (mut io, devices) = if setup.announce || activated.is_some() {
        let (io, devices, held) = HostIo::take_over(backends, tx.clone(), taps, activated.clone())?;
        for disk in held {
            eprintln!(
                "ftvm: the old primary still holds the lock on {}: taken over (it is fenced: it writes nothing more)",
                disk.display()
            );
        }
        (io, devices)
    } else {
        HostIo::open(backends, tx.clone(), Fence::alone())?
    };
    if devices != m.devices() {
        return Err(VmmError::DevicesChanged);
    }
    if setup.announce {
        io.announce();
        if !setup.resend.is_empty() {
            io.resend(&setup.resend);
            eprintln!("ftvm: sent again the last segment of {} TCP connection(s)", setup.resend.len());
        }
    }
    if !setup.undelivered.is_empty() {
        for (slot, frame) in &setup.undelivered {
            io.receive(*slot, frame.clone());
        }
        eprintln!(
            "ftvm: giving the guest {} frame(s) its primary received and never delivered",
            setup.undelivered.len()
        );
    }
    if let (Some(activation), Some(fence)) = (activation, activated) {
        let tx = tx.clone();
        std::thread::Builder::new()
            .name("ft-activation".into())
            .spawn(move || {
                let started = std::time::Instant::now();
                let written = activation.write();
                // Before the loop hears of it: the outputs may go, or never.
                match &written {
                    Ok(_) => fence.won(),
                    Err(_) => fence.deposed(),
                }
                tracing::debug!(activation_us = started.elapsed().as_micros() as u64, "going live: activated");
                let _ = tx.send(HostEvent::Activated(written));
            })
            .map_err(|e| ProtectionError::Thread("activation", e))?;
    }
    crate::signals::forward_stop_signals(tx.clone());
    // The console as clients see it from here on (a backup's replay
    // showed nothing of it).
    let console_hub = crate::attach::ConsoleHub::default();
    console_hub.publish(&setup.console_shown);
    console_hub.set_input(tx.clone());
    let _control = match &setup.control {
        Some(path) => {
            io.set_control(true);
            Some(control::listen(path, tx.clone(), setup.events.clone(), console_hub.clone())?)
        }
        None => None,
    };
    if setup.console_input {
        console::spawn_reader(tx.clone(), HostEvent::Console, true);
    }
    drop(tx);
    let opts = live::Options {
        console: console_hub,
        fast_time: false,
        exec: None,
        show_boot: false,
        console_input: setup.console_input,
        paused: false,
        ft_alone: setup.announce,
        limits: None,
        stop_timeout: std::time::Duration::from_secs(ftvm_api::vm_config::DEFAULT_STOP_TIMEOUT_S),
        disk_keepers: Vec::new(),
        cpu_limit: setup.cpu_limit,
        // Gone live, it is a VM like any other, with the default.
        parallel_harts: true,
    };
    tracing::debug!(setup_us = started.elapsed().as_micros() as u64, "going live: the host's devices set up");
    let on_reset = live::OnReset::Refuse(crate::error::RebootRefused::WentLive);
    // Live, it is a VM like any other: it can be given a backup (again).
    let protector = MachineProtector { journal: setup.events.clone() };
    live::run(m, io, events, opts, on_reset, None, Some(Box::new(protector)))
}
