//! The live host loop of a running VM: runs the machine in chunks, hands
//! its I/O requests to the host backends, applies what comes back (I/O
//! completions, received frames, console input) at instruction boundaries,
//! answers the control socket, shows console output, and keeps guest time
//! close to the wall clock.
//!
//! Time is steered only through machine events (`ClockRate` while busy,
//! `ClockAdvance` while idle), so a recording of the events is enough to
//! replay the run exactly. While every hart is idle the loop sleeps until
//! the guest's next timer deadline or until something arrives: an idle
//! guest does not burn a host core.
//!
//! The loop drives any [`Engine`]: it asks nothing of the VM that an
//! engine without exact instruction counts could not give (guest time is
//! steered only where the engine's clock is, `Engine::steered_clock_rate`).
//!
//! Whatever watches over the run (a recording, or the primary's side of a
//! fault-tolerant pair) does so through one interface, `protection::primary::Primary`:
//! it says where each run stops, which inputs may be delivered where the
//! machine stands, which requests may leave, and what to do between runs.
//! The loop knows no replication mode by name.

use crate::api::events::TransferFigures;
use crate::api::{ControlError, Mode, PairStatus, Reply, Request, Response, RunState, VmStatus};
use crate::console::{Input, RawTerminal};
use crate::control::ControlRequest;
use crate::error::{RebootRefused, VmmError};
use crate::exec::ExecSession;
use crate::ft::protect::Protector;
use crate::host_io::{HostEvent, HostIo};
use crate::pacing::Pacer;
use crate::slice::SliceSize;
use crate::watch::ConsoleWatch;
use ftvm_machine::layout::TIMEBASE_HZ;
use ftvm_machine::{snapshot_file, Engine, Event, IoCompletion, IoRequest, RunExit};
use ftvm_protection::control::ControlEntry;
use ftvm_protection::error::ProtectionError;
use ftvm_protection::primary::{Alone, HandOver, Primary};
use ftvm_replication::channel::PrimaryEvent;
use ftvm_replication::duty::DutyCycle;
use std::collections::VecDeque;
use std::io::Write;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

/// A handover takes in what arrives after it released the held outputs
/// until this long after the last frame it sent (a client answers a
/// reply within a round trip and its own processing), ...
const ABSORB_QUIET: Duration = Duration::from_millis(2);
/// ... and this long after the last input that came (what is already on
/// its way arrives within microseconds on a LAN; the machine is stopped,
/// so nothing that came can be answered now), ...
const ABSORB_IN_FLIGHT: Duration = Duration::from_micros(500);
/// ... but for no longer than this.
const ABSORB_MOST: Duration = Duration::from_millis(10);
/// After its panic line, how long the guest's kernel may go on printing
/// (its stack trace, up to the end line) before the run ends.
const PANIC_GRACE: Duration = Duration::from_secs(2);
/// How long a transfer's final pause waits for the I/O in flight to
/// finish (a disk that takes longer ends the attempt, not the VM).
const QUIESCE_MOST: Duration = Duration::from_secs(5);
/// A clean stop's SysRq keys (see [`Stopping`]): SIGTERM to the guest's
/// processes, then (their time to end) sync, remount read-only, power off;
/// each after a break on the console line, and each with the time the one
/// before it is given first.
const STOP_KEYS: [(u8, Duration); 4] =
    [(b'e', Duration::ZERO), (b's', Duration::from_secs(2)), (b'u', Duration::ZERO), (b'o', Duration::from_secs(1))];

/// A VM alone asked to stop by SIGTERM or SIGINT: its guest is asked to
/// power off, and stopped by us if it has not within the grace period.
///
/// How the guest is asked: the guest's kernel (Debian's, unchanged) is
/// sent a magic SysRq on its serial console, a break on the line followed
/// by a key, as an operator would with a serial console server's "send
/// break": `e` (SIGTERM to every process but init, so services end as
/// they would at a shutdown), two seconds later `s` (sync the
/// filesystems), `u` (remount them read-only), and a second later `o`
/// (power off, which the kernel does through the board's syscon-poweroff:
/// "reboot: Power down" on the console, then the syscon's pass code, 0).
/// Chosen over the alternatives because it needs nothing of the guest's
/// userland but one setting and works with the kernel as built:
/// - a key sequence for the guest's shell or init to act on would depend
///   on what reads the console at the time (an interactive shell, a
///   program, nothing in `--exec` mode);
/// - a power button needs a driver the guest has: Debian's riscv64
///   kernel has neither ACPI here nor `gpio-keys` (CONFIG_KEYBOARD_GPIO
///   is not set), and only a new virtio-input device (virtio_input is a
///   module) or a new register that ftvm's own init polls would do, the
///   latter a change to the image and a wake-up a second in every guest;
/// - Debian enables SysRq's sync, remount and power-off by default
///   (CONFIG_MAGIC_SYSRQ_DEFAULT_ENABLE=0x01b6) and on the serial console
///   (CONFIG_MAGIC_SYSRQ_SERIAL=y); `e` (signalling, 0x40) is off by
///   default, and ftvm's image turns it on at boot (guest/ftvm-init).
///
/// What is lost next to an ACPI power button and an init's shutdown:
/// every process gets SIGTERM at once, not in a service manager's order,
/// and has two seconds before the filesystems go read-only (a guest
/// without the `e` bit, another image's, skips that step). A guest that
/// turned SysRq off (`kernel.sysrq=0`) ignores the request and is stopped
/// after the grace period. The break and the keys are machine inputs
/// (`Event::ConsoleBreak`, `Event::ConsoleInput`) like typed ones: a
/// recording logs them and a replay repeats them.
struct Stopping {
    signal: i32,
    /// When ftvm stops the guest itself.
    deadline: Instant,
    /// The SysRq keys not yet sent, each with how long after the one
    /// before it it is sent, and when the last was sent.
    keys: VecDeque<(u8, Duration)>,
    last_key_at: Instant,
    /// An `--exec` command was running when the signal came: the run ends
    /// with 128 + the signal's number whatever the command then did with
    /// its own SIGTERM, so a script sees it was cut short.
    cut_short: bool,
}

pub struct Options {
    /// Skip idle time at once and never slow down for the wall clock.
    pub fast_time: bool,
    /// Running `--exec` with this command: the console carries the exec
    /// protocol (exec.rs), and the run exits with the guest's status.
    pub exec: Option<String>,
    pub show_boot: bool,
    /// Whether stdin is read: the VM's console (a terminal or a pipe), or
    /// with `--exec` the command's stdin.
    pub console_input: bool,
    /// Start paused, waiting for `resume` on the control socket.
    pub paused: bool,
    /// A fault-tolerant VM running without a backup (status says so).
    pub ft_alone: bool,
    /// With `--exec`: how long the boot and the command may take.
    pub limits: Option<ExecLimits>,
    /// After SIGTERM or SIGINT, how long the guest of a VM alone has to
    /// power off before it is stopped.
    pub stop_timeout: Duration,
    /// The run's copies of an image's root disk (`overlay`): a snapshot
    /// names them, so taking one keeps them after the run.
    pub disk_keepers: Vec<crate::overlay::Keeper>,
    /// The VM's CPU limit, in percent of one host core (None: none).
    pub cpu_limit: Option<u8>,
    /// Whether the harts may run in parallel on threads of their own
    /// (`--hart-threads multi`) when nothing needs the run exact.
    pub parallel_harts: bool,
    /// The console as the control socket's clients see it (`ftvm
    /// console`): its output is published there too.
    pub console: crate::attach::ConsoleHub,
}

/// A new VM of engine `E`, booting (for a guest's reboot request).
pub type Boot<E> = Box<dyn FnMut() -> Result<E, VmmError>>;

/// What a guest's reboot request (`RunExit::Reset`) does.
pub enum OnReset<E> {
    /// Boot again: a new machine from the same configuration (firmware,
    /// kernel, initrd, command line, devices), its devices served by the
    /// same host backends (disks, TAPs; the control socket stays).
    Boot(Boot<E>),
    /// End the run with this reason. A recorded or protected VM cannot
    /// reboot yet: the replay log has no record for a reset, so a replayer
    /// (or a backup) could not follow the run past it; a new machine
    /// mid-log would need the header's start (firmware, kernel, initrd)
    /// logged again, and checkpoint mode a checkpoint of the new machine.
    /// A VM restored from a snapshot has no firmware or kernel to boot.
    Refuse(RebootRefused),
}

/// Wall-time limits of `--exec` (time paused through the control socket
/// does not count).
#[derive(Debug, Clone, Copy)]
pub struct ExecLimits {
    /// From the start of the boot to the command's start (its marker).
    pub boot: Duration,
    /// From the command's start to the end of the run.
    pub command: Option<Duration>,
}

/// How far the guest's date (its RTC's) stands behind the host's now, by
/// the clock a new VM's RTC base is taken from.
fn date_behind(m: &impl Engine) -> Duration {
    let host = crate::launch::wall_clock_ns();
    m.rtc_now_ns().map_or(Duration::ZERO, |guest| Duration::from_nanos(host.saturating_sub(guest)))
}

/// This thread's CPU time (CLOCK_THREAD_CPUTIME_ID).
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the one we pass.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    debug_assert_eq!(r, 0, "every thread has a CPU-time clock");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// What handling a host event asks of the loop.
enum Next {
    Continue,
    Exit(u32),
}

struct Live<E: Engine> {
    m: E,
    io: HostIo,
    opts: Options,
    on_reset: OnReset<E>,
    pacer: Pacer,
    /// How many instructions a run goes before the loop looks at the host.
    slice: SliceSize,
    paused: bool,
    input_closed: bool,
    /// Typed or pasted input waiting for room in the guest's UART.
    pending: VecDeque<u8>,
    /// Completions that arrived while paused: a paused machine does not
    /// change, so they wait for `resume`.
    held: VecDeque<(usize, IoCompletion)>,
    exec: Option<ExecSession>,
    /// What watches over the run: a recording, or the primary's side of
    /// a fault-tolerant pair (until the backup is lost).
    primary: Option<Box<dyn Primary<E>>>,
    /// The primary lost the arbiter to its backup: it halts, and neither
    /// its held outputs nor the end of its stream may leave.
    halted: bool,
    /// The guest powered off (rather than the user quitting).
    powered_off: bool,
    /// Inputs applied so far; an idle machine that just got one must run
    /// before anyone sleeps on its old timer deadline.
    injected: u64,
    /// What the console shows that the host acts on.
    watch: ConsoleWatch,
    /// The guest kernel's panic line, when it was seen, and whether the
    /// kernel has finished reporting it.
    panicked: Option<(String, Instant, bool)>,
    /// `--exec`: when the boot, then the command, runs out of time.
    boot_deadline: Option<Instant>,
    command_deadline: Option<Instant>,
    /// When the VM was paused (the deadlines move on by the pause).
    paused_at: Option<Instant>,
    /// A handover was asked for (by `handover`, whose answer waits here,
    /// or by SIGTERM): it happens where the machine next stands where
    /// inputs may be delivered.
    hand_over_asked: Option<Option<Sender<Response>>>,
    /// How this VM is given a backup while it runs (None: it cannot be).
    protector: Option<Box<dyn Protector<E>>>,
    /// A `protect` under way, whose answer waits here until the pair
    /// starts or the attempt fails.
    protect_reply: Option<Sender<Response>>,
    /// The mode the last `protect` asked for: the one its reply names.
    protect_mode: Mode,
    /// A protected VM's transfer to a new backup (the backup moves): the
    /// pair in force goes on meanwhile, and ends in the final pause.
    moving: Option<Box<dyn Primary<E>>>,
    /// Whether the machine's harts run in parallel (`choose_parallel`).
    parallel: bool,
    /// An `unprotect` asked for, whose answer waits here: it happens
    /// where the machine next stands where inputs may be delivered.
    unprotect_asked: Option<Sender<Response>>,
    /// The signal that asked for a handover (or a recording's end), for
    /// messages.
    terminate_signal: i32,
    /// A clean stop under way (SIGTERM or SIGINT on a VM alone).
    stopping: Option<Stopping>,
    /// The pauses that hold the VM thread to `opts.cpu_limit`.
    cpu_duty: DutyCycle,
    /// The CPU limit is to go to the backup (a pair just started): sent
    /// after the next run, once the pair's stream is flowing.
    cpu_limit_unsent: bool,
}

pub fn run<E: Engine>(
    m: E,
    io: HostIo,
    events: Receiver<HostEvent>,
    opts: Options,
    on_reset: OnReset<E>,
    primary: Option<Box<dyn Primary<E>>>,
    protector: Option<Box<dyn Protector<E>>>,
) -> Result<u32, VmmError> {
    let _term = if opts.console_input && opts.exec.is_none() { Some(RawTerminal::enter()) } else { None };
    let boot_deadline = opts.limits.and_then(|l| Instant::now().checked_add(l.boot));
    let paused_at = opts.paused.then(Instant::now);
    let mut live = Live {
        pacer: Pacer::new(m.time(), m.icount(), Instant::now()).catching_up(date_behind(&m)),
        slice: SliceSize::default(),
        m,
        io,
        paused: opts.paused,
        input_closed: !opts.console_input,
        pending: VecDeque::new(),
        held: VecDeque::new(),
        exec: opts.exec.as_deref().map(|cmd| {
            let mut s = ExecSession::new(cmd, opts.show_boot);
            // Nothing is read from the host's stdin: the command's ends at once.
            if !opts.console_input {
                s.input_end();
            }
            s
        }),
        opts,
        on_reset,
        primary,
        halted: false,
        powered_off: false,
        injected: 0,
        watch: ConsoleWatch::new(),
        panicked: None,
        boot_deadline,
        command_deadline: None,
        paused_at,
        hand_over_asked: None,
        protector,
        protect_reply: None,
        protect_mode: Mode::Lockstep,
        unprotect_asked: None,
        moving: None,
        parallel: false,
        terminate_signal: signal_hook::consts::SIGTERM,
        stopping: None,
        cpu_duty: DutyCycle::default(),
        cpu_limit_unsent: false,
    };
    live.cpu_limit_unsent = live.opts.cpu_limit.is_some();
    // After a restore, the I/O the machine was waiting for is issued again.
    let again = live.m.io_in_flight();
    live.io.dispatch(again);
    let result = live.main_loop(&events);
    let status = result.as_ref().ok().copied().filter(|_| live.powered_off);
    if let (Some(p), false) = (&mut live.primary, live.halted) {
        let last = p.end(&mut live.m, status);
        live.io.dispatch(last);
    }
    // Writes the guest was told about must be on disk before we go.
    live.io.drain();
    // A VM stopped by a signal (the host shutting down, an operator) also
    // leaves its disks on stable storage, whether its guest powered off
    // (it synced them) or was stopped.
    if live.stopping.is_some() {
        for path in live.io.disk_paths() {
            if let Err(e) = std::fs::File::open(path).and_then(|f| f.sync_data()) {
                eprintln!("ftvm: cannot flush {}: {e}", path.display());
            }
        }
    }
    if let Some(p) = live.primary.take() {
        if let Some(summary) = p.summary() {
            eprintln!("ftvm: {summary}");
        }
        if !live.halted {
            p.finish(&mut live.m, status)?;
        }
    }
    result
}

impl<E: Engine> Live<E> {
    fn main_loop(&mut self, events: &Receiver<HostEvent>) -> Result<u32, VmmError> {
        loop {
            self.check_limits()?;
            // Before the stream closes what it owes here: in epoch mode
            // the handover's mark is this epoch end's (the backup runs on
            // past an end it has taken, so no second frame may come at it).
            if self.hand_over_asked.is_some() && self.primary.as_ref().is_some_and(|p| p.accepts_inputs()) {
                if let Next::Exit(code) = self.hand_over(events)? {
                    return Ok(code);
                }
            }
            if self.unprotect_asked.is_some() && self.primary.as_ref().is_some_and(|p| p.accepts_inputs()) {
                self.unprotect()?;
            }
            if let Some(p) = &mut self.primary {
                p.before_run(&mut self.m, self.paused)?;
            }
            self.choose_parallel();
            let (started, cpu_before, icount_before) = (Instant::now(), thread_cpu_time(), self.m.icount());
            let exit = if self.paused { None } else { Some(self.m.run_until(self.run_target())) };
            let busy = started.elapsed();
            let cpu = thread_cpu_time().saturating_sub(cpu_before);
            self.slice.ran(self.m.icount().saturating_sub(icount_before), busy);
            self.pacer.ran(self.m.run_cpu_time().map_or(cpu, |busiest| busiest.max(cpu)));
            let injected_before = self.injected;
            if let (Some(exit), Some(t)) = (&exit, &mut self.moving) {
                // A transfer delivers no inputs: it only notes where the
                // machine stands.
                let none = t.after_run(&self.m, exit);
                debug_assert!(none.is_empty());
            }
            if let (Some(exit), Some(p)) = (&exit, &mut self.primary) {
                for ev in p.after_run(&self.m, exit) {
                    self.inject(ev);
                }
            }
            let requests = self.m.take_io_requests();
            self.dispatch(requests);
            if let Some(exit) = &exit {
                self.after_slice(busy, matches!(exit, RunExit::Idle { .. }))?;
                if self.cpu_limit_unsent {
                    self.send_cpu_limit(self.opts.cpu_limit.unwrap_or(100));
                }
            }
            if self.successor_due() {
                if let Next::Exit(code) = self.succeed(events)? {
                    return Ok(code);
                }
            }
            self.show_output();
            while let Ok(ev) = events.try_recv() {
                if let Next::Exit(code) = self.handle(ev)? {
                    return Ok(code);
                }
            }
            if self.primary.as_ref().is_none_or(|p| p.accepts_inputs()) {
                self.feed_inputs();
            }
            match exit {
                None => {
                    // Paused: nothing runs until a command or an event comes
                    // (or a clean stop's grace, paused after it began, ends).
                    let ev = match self.stopping.as_ref().map(|s| s.deadline) {
                        None => events.recv().map_err(|_| VmmError::EventsClosed)?,
                        Some(t) => match events.recv_timeout(t.saturating_duration_since(Instant::now())) {
                            Ok(ev) => ev,
                            Err(RecvTimeoutError::Timeout) => continue,
                            Err(RecvTimeoutError::Disconnected) => return Err(VmmError::EventsClosed),
                        },
                    };
                    if let Next::Exit(code) = self.handle(ev)? {
                        return Ok(code);
                    }
                }
                Some(RunExit::Reached) | Some(RunExit::Io) => {
                    if !self.opts.fast_time {
                        if let Next::Exit(code) = self.pace(events)? {
                            return Ok(code);
                        }
                    }
                }
                Some(RunExit::PowerOff(code)) => {
                    self.powered_off = true;
                    // Powered off as a signal asked, before `--exec`'s
                    // command finished: a script must see it cut short.
                    if let Some(stop) = &self.stopping {
                        if stop.cut_short {
                            let signal = crate::signals::name(stop.signal);
                            return Err(VmmError::ExecInterrupted { signal, signo: stop.signal });
                        }
                    }
                    // The guest's init could not start the command.
                    if let Some(why) = self.exec.as_ref().and_then(|e| e.setup_error()) {
                        return Err(VmmError::ExecSetup(why.to_string()));
                    }
                    return Ok(code);
                }
                Some(RunExit::Reset) => {
                    if let Next::Exit(code) = self.reset(events)? {
                        return Ok(code);
                    }
                }
                // Input arrived since the machine went idle: it may wake it,
                // so run again rather than sleep on the old deadline.
                Some(RunExit::Idle { .. }) if self.injected != injected_before => {}
                Some(RunExit::Idle { wake_at }) => {
                    if let Next::Exit(code) = self.idle(wake_at, events)? {
                        return Ok(code);
                    }
                }
            }
        }
    }

    /// Ends the run once a guest whose kernel panicked has had its time
    /// to report it, and an `--exec` run that is out of time.
    fn check_limits(&self) -> Result<(), VmmError> {
        if let Some(stop) = &self.stopping {
            if Instant::now() >= stop.deadline {
                return Err(VmmError::StopTimeout {
                    signal: crate::signals::name(stop.signal),
                    signo: stop.signal,
                    seconds: self.opts.stop_timeout.as_secs_f64(),
                });
            }
        }
        if let Some((line, at, ended)) = &self.panicked {
            if *ended || at.elapsed() >= PANIC_GRACE {
                return Err(VmmError::GuestPanicked(line.clone()));
            }
        }
        if self.paused {
            return Ok(());
        }
        let now = Instant::now();
        if let (Some(t), Some(l)) = (self.boot_deadline, self.opts.limits) {
            if now >= t {
                return Err(VmmError::BootTimeout(l.boot.as_secs()));
            }
        }
        if let (Some(t), Some(ExecLimits { command: Some(c), .. })) = (self.command_deadline, self.opts.limits) {
            if now >= t {
                return Err(VmmError::ExecTimeout(c.as_secs()));
            }
        }
        Ok(())
    }

    /// The next moment `check_limits` may end the run.
    fn next_limit(&self) -> Option<Instant> {
        let grace = self.panicked.as_ref().map(|(_, at, _)| *at + PANIC_GRACE);
        let timeouts =
            if self.paused { None } else { self.boot_deadline.into_iter().chain(self.command_deadline).min() };
        // A clean stop's next key is sent, and its grace runs out, on time.
        let stop = self.stopping.iter().flat_map(|s| {
            let key = s.keys.front().map(|&(_, after)| s.last_key_at + after);
            key.into_iter().chain([s.deadline])
        });
        grace.into_iter().chain(timeouts).chain(stop).min()
    }

    /// The guest asked to reboot: in a plain run, boot a new machine from
    /// the same configuration with the same host backends.
    fn reset(&mut self, events: &Receiver<HostEvent>) -> Result<Next, VmmError> {
        let boot = match &mut self.on_reset {
            OnReset::Refuse(why) => return Err(VmmError::Reboot(*why)),
            // Whatever watches over the run logs or streams this machine.
            _ if self.primary.is_some() => return Err(VmmError::Reboot(RebootRefused::Protected)),
            OnReset::Boot(boot) => boot,
        };
        // The old machine's disk requests finish (a write it issued lands,
        // as on a real disk across a reset); their completions, and any
        // other the old devices waited for, are dropped. News for the
        // host (console input, control requests, frames) is kept.
        self.io.drain();
        let mut kept = Vec::new();
        while let Ok(ev) = events.try_recv() {
            if !matches!(ev, HostEvent::Io(..)) {
                kept.push(ev);
            }
        }
        self.held.clear();
        self.m = boot()?;
        self.pacer = self.fresh_pacer();
        // A new boot: its messages are hidden again until the command
        // starts, and the boot has its time limit again (the command's
        // limit runs on from its first start).
        if let Some(exec) = &mut self.exec {
            exec.restart();
            // What was typed for the old boot is not the new one's.
            self.pending.clear();
        }
        self.watch = ConsoleWatch::new();
        if self.command_deadline.is_none() {
            self.boot_deadline = self.opts.limits.and_then(|l| Instant::now().checked_add(l.boot));
        }
        for ev in kept {
            if let Next::Exit(code) = self.handle(ev)? {
                return Ok(Next::Exit(code));
            }
        }
        Ok(Next::Continue)
    }

    /// Runs the harts in parallel whenever nothing needs the run to be
    /// repeatable (no recording, no replaying backup, no transfer under
    /// way) and no CPU limit holds the VM to a share of one core (the
    /// limit's pauses are measured on this thread).
    fn choose_parallel(&mut self) {
        let on = self.opts.parallel_harts
            && self.opts.cpu_limit.is_none()
            && self.moving.is_none()
            && self.primary.as_ref().is_none_or(|p| !p.needs_determinism());
        if on != self.parallel {
            self.parallel = on;
            self.m.set_parallel(on);
        }
    }

    fn run_target(&self) -> u64 {
        let icount = self.m.icount();
        let mut chunk = self.slice.instructions();
        if let (false, Some(rate)) = (self.opts.fast_time, self.m.steered_clock_rate()) {
            chunk = chunk.min(self.pacer.instructions_to_bound(rate, self.m.time(), Instant::now()));
        }
        let look_at = icount + chunk;
        let target = self.primary.as_ref().map_or(look_at, |p| p.run_target(icount, look_at));
        self.moving.as_ref().map_or(target, |t| t.run_target(icount, target).min(target))
    }

    /// Whether a transfer asks for its final pause now: a move's also
    /// waits until the pair in force stands where inputs may be delivered
    /// (an epoch end), where its stream can end.
    fn successor_due(&self) -> bool {
        match &self.moving {
            Some(t) => t.successor_due() && self.primary.as_ref().is_none_or(|p| p.accepts_inputs()),
            None => self.primary.as_ref().is_some_and(|p| p.successor_due()),
        }
    }

    /// Pacing for a machine that starts or goes on from here, its guest
    /// time as it stands.
    fn fresh_pacer(&self) -> Pacer {
        Pacer::new(self.m.time(), self.m.icount(), Instant::now())
    }

    /// After a busy run: a new clock rate when the host's speed says so,
    /// and a wait for the wall clock when guest time stands too far ahead
    /// of it (see `pacing`), taking what arrives meanwhile.
    fn pace(&mut self, events: &Receiver<HostEvent>) -> Result<Next, VmmError> {
        let Some(rate) = self.m.steered_clock_rate() else {
            return Ok(Next::Continue);
        };
        if let Some(new) = self.pacer.correct(rate, self.m.time(), self.m.icount(), Instant::now()) {
            self.inject(Event::ClockRate(new));
        }
        let Some(wait) = self.pacer.wait_for_wall(self.m.time(), Instant::now()) else {
            return Ok(Next::Continue);
        };
        match events.recv_timeout(wait) {
            Ok(ev) => self.handle(ev),
            Err(RecvTimeoutError::Timeout) => Ok(Next::Continue),
            Err(RecvTimeoutError::Disconnected) => Err(VmmError::EventsClosed),
        }
    }

    /// Every hart waits for an interrupt: sleep until the timer deadline
    /// or until something arrives, then move guest time to now.
    fn idle(&mut self, wake_at: Option<u64>, events: &Receiver<HostEvent>) -> Result<Next, VmmError> {
        let io_busy = self.m.io_pending();
        if self.opts.fast_time && !io_busy {
            if let Some(t) = wake_at {
                self.inject(Event::ClockAdvance(t));
                return Ok(Next::Continue);
            }
        }
        let wait = if self.opts.fast_time {
            // Waiting only for I/O: guest time stands still meanwhile.
            None
        } else {
            let now = self.pacer.wall_ticks(Instant::now());
            wake_at.map(|t| Duration::from_secs_f64(t.saturating_sub(now) as f64 / TIMEBASE_HZ as f64))
        };
        let nothing_can_come = self.input_closed && !io_busy && !self.io.has_network() && !self.io.has_control();
        // A protected VM wakes to show the backup it is alive (and to let
        // acknowledged outputs go, which the events also do).
        let now = Instant::now();
        let keepalive = [&self.primary, &self.moving].into_iter().flatten().filter_map(|p| p.wake_within(now)).min();
        let capped = match (wait, keepalive) {
            (Some(d), Some(k)) if k < d => Some(k),
            (None, Some(k)) => Some(k),
            (w, _) => w,
        };
        if capped.is_none() && nothing_can_come {
            return Err(VmmError::StuckIdle);
        }
        // Wake in time to end a run that is over its limit.
        let capped = match (capped, self.next_limit().map(|t| t.saturating_duration_since(Instant::now()))) {
            (Some(d), Some(l)) if l < d => Some(l),
            (None, Some(l)) => Some(l),
            (c, _) => c,
        };
        let early = capped != wait;
        // Nothing more comes to batch the log with while the guest sleeps.
        if let Some(p) = &mut self.primary {
            p.before_sleep();
        }
        let got = match capped {
            Some(d) => match events.recv_timeout(d) {
                Ok(ev) => Some(ev),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return Err(VmmError::EventsClosed),
            },
            None => Some(events.recv().map_err(|_| VmmError::EventsClosed)?),
        };
        if got.is_none() && early && wake_at.is_none_or(|t| self.pacer.wall_ticks(Instant::now()) < t) {
            // Woke for the keep-alive only: the guest sleeps on.
            return Ok(Next::Continue);
        }
        // News that is the host's, not the guest's (an acknowledgement
        // from the backup, a control request), does not move guest time:
        // it would be logged, acknowledged, and wake us again, a loop
        // that kept an idle protected guest logging 0.75 Mbit/s.
        if let Some(ev @ (HostEvent::Replication(PrimaryEvent::Acked) | HostEvent::Control(_))) = got {
            let next = self.handle(ev)?;
            self.feed_inputs();
            return Ok(next);
        }
        if !self.opts.fast_time {
            let target = match wake_at {
                Some(t) if got.is_none() => t,
                _ => self.pacer.wall_ticks(Instant::now()),
            };
            // The pacer's measurement goes on across the idle spell: it
            // counts instructions and running time only. Restarted here,
            // as it was, a guest that idles between requests every few
            // milliseconds never gave it the interval it corrects over,
            // and kept whatever rate it last had while busy (found: a
            // guest's date 3 s ahead after 5 s under load).
            self.inject(Event::ClockAdvance(target));
        }
        if let Some(ev) = got {
            let next = self.handle(ev)?;
            self.feed_inputs();
            return Ok(next);
        }
        Ok(Next::Continue)
    }

    fn handle(&mut self, ev: HostEvent) -> Result<Next, VmmError> {
        match ev {
            HostEvent::Console(Input::Bytes(b)) => match &mut self.exec {
                Some(exec) => {
                    exec.input(&b);
                    self.pending.extend(exec.take_to_guest());
                }
                None => self.pending.extend(b),
            },
            HostEvent::Console(Input::Quit) => return Ok(Next::Exit(0)),
            HostEvent::Console(Input::Eof) => {
                self.input_closed = true;
                if let Some(exec) = &mut self.exec {
                    exec.input_end();
                    self.pending.extend(exec.take_to_guest());
                }
            }
            HostEvent::Io(slot, completion) if self.paused => self.held.push_back((slot, completion)),
            HostEvent::Io(slot, completion) => {
                self.inject(Event::Io { slot, completion });
            }
            HostEvent::Frame(slot, frame) => self.io.receive(slot, frame),
            HostEvent::Control(req) => return self.control(req),
            HostEvent::Replication(PrimaryEvent::Acked) => self.dispatch(Vec::new()),
            HostEvent::Activated(written) => {
                for record in written? {
                    eprintln!("ftvm: wrote the activation record {}", record.display());
                }
                // What the VM did meanwhile leaves now, in order.
                self.dispatch(Vec::new());
            }
            HostEvent::Replication(PrimaryEvent::BackupLost(failure)) => {
                // A move's new backup failed: the move is off, the pair in
                // force goes on (unless its own backup failed too).
                if self.moving.as_ref().is_some_and(|t| t.stream_failed()) {
                    if let Some(mut t) = self.moving.take() {
                        let _ = t.peer_lost(&failure);
                    }
                    if let Some(reply) = self.protect_reply.take() {
                        let _ = reply.send(Response::Error(ControlError::ProtectFailed(format!(
                            "the new backup failed during the transfer ({failure}); the pair in force goes on"
                        ))));
                    }
                    if !self.primary.as_ref().is_some_and(|p| p.stream_failed()) {
                        return Ok(Next::Continue);
                    }
                }
                let Some(p) = &mut self.primary else { return Ok(Next::Continue) };
                // The stream of a pair that has ended since (a moved
                // backup's old pair) closes too: it concerns no one now.
                if !p.stream_failed() {
                    return Ok(Next::Continue);
                }
                let alone = p.peer_lost(&failure).inspect_err(|_| {
                    // Halting: the backup is the VM now. Nothing more goes
                    // into the stream and no held output leaves.
                    self.halted = true;
                })?;
                self.run_alone(alone);
                if let Some(reply) = self.protect_reply.take() {
                    let _ = reply.send(Response::Error(ControlError::ProtectFailed(format!(
                        "the new backup failed during the transfer ({failure}); the VM runs on unprotected"
                    ))));
                }
                // A handover asked for has nobody to go to now.
                if let Some(reply) = self.hand_over_asked.take().flatten() {
                    let _ = reply.send(Response::Error(ControlError::HandOverFailed(format!(
                        "the backup failed ({failure}); this side runs on unprotected"
                    ))));
                }
            }
            HostEvent::Terminate(signal) if self.primary.is_some() => {
                if self.hand_over_asked.is_none() {
                    eprintln!("ftvm: {}: handing the VM over to the backup", crate::signals::name(signal));
                    self.terminate_signal = signal;
                    self.hand_over_asked = Some(None);
                }
            }
            HostEvent::Terminate(signal) => return self.stop(signal),
            HostEvent::Protection(setup) => match (setup.transfer, &self.protector) {
                (Ok(transfer), Some(protector)) if self.moving.is_none() => {
                    // Every request from here on goes through the
                    // transfer (writes into the stream, where the backup
                    // keeps its own disks): those before it land first,
                    // so its copy of the disks misses none.
                    self.io.drain();
                    let transfer = protector.transfer(transfer);
                    // Protected already: the backup moves, the pair in
                    // force going on until the new one starts.
                    match &self.primary {
                        Some(_) => self.moving = Some(transfer),
                        None => self.primary = Some(transfer),
                    }
                }
                (Ok(_), _) => {}
                (Err(e), _) => {
                    eprintln!("ftvm: protection failed: {e}");
                    if let Some(reply) = self.protect_reply.take() {
                        let _ = reply.send(Response::Error(ControlError::ProtectFailed(e.to_string())));
                    }
                }
            },
        }
        Ok(Next::Continue)
    }

    /// Alone now (the backup lost, or a handover that failed): no more
    /// stream, outputs go out as they come, and inputs held for a point
    /// of delivery go in now.
    fn run_alone(&mut self, Alone { outputs, inputs }: Alone) {
        self.primary = None;
        self.opts.ft_alone = true;
        self.io.dispatch(outputs);
        for ev in inputs {
            self.inject(ev);
        }
    }

    /// A planned handover, with the machine stopped where inputs may be
    /// delivered: the outputs the backup has all the log for go, the
    /// host drains them (a write of this side landing after the backup
    /// went live would undo the backup's), the stream ends, and once the
    /// backup has claimed the VM this side exits. If the backup does not
    /// catch up in time the pair runs on; if it fails, this side runs on
    /// alone.
    fn hand_over(&mut self, events: &Receiver<HostEvent>) -> Result<Next, VmmError> {
        let reply = self.hand_over_asked.take().flatten();
        let answer = |r: Result<Reply, ControlError>| answer(reply.as_ref(), r);
        let Some(p) = &mut self.primary else {
            answer(Err(ControlError::NotProtected));
            return Ok(Next::Continue);
        };
        let stopped = Instant::now();
        let out = match p.hand_over(&mut self.m) {
            Ok(out) => out,
            // A recording: SIGTERM (or SIGINT) ends it as `quit` would.
            Err(ProtectionError::NoBackupToHandOver) if reply.is_none() => {
                eprintln!("ftvm: {}: quitting", crate::signals::name(self.terminate_signal));
                return Ok(Next::Exit(0));
            }
            Err(e) => {
                answer(Err(ControlError::HandOverFailed(e.to_string())));
                return Ok(Next::Continue);
            }
        };
        let released = stopped.elapsed();
        self.io.dispatch(out);
        self.io.drain();
        // Inputs that came meanwhile go in before the stream ends: the
        // completions of what drained, and a client's next request, sent
        // as soon as the last reply it had from this side reached it.
        // Left out, that request would be lost with this side, and the
        // client would wait out a retransmission (200 ms at least). So
        // they are taken until ABSORB_QUIET after the last frame this side
        // sent (a client has answered by then) and ABSORB_IN_FLIGHT after
        // the last that came, at most ABSORB_MOST. News for the pair and
        // control requests wait for the outcome.
        let mut later = Vec::new();
        let absorb_until = Instant::now() + ABSORB_MOST;
        let answered_by = self.io.last_frame_sent().map(|sent| sent + ABSORB_QUIET);
        let mut last_came = Instant::now();
        loop {
            let until = answered_by.map_or(last_came, |t| t.max(last_came)).max(last_came + ABSORB_IN_FLIGHT);
            let wait = until.min(absorb_until).saturating_duration_since(Instant::now());
            let Ok(ev) = events.recv_timeout(wait) else { break };
            last_came = Instant::now();
            match ev {
                HostEvent::Replication(_) | HostEvent::Control(_) | HostEvent::Terminate(_) => later.push(ev),
                ev => {
                    self.handle(ev)?;
                }
            }
        }
        self.feed_inputs();
        let absorbed = stopped.elapsed();
        let p = self.primary.as_mut().expect("still protected");
        let next = match p.hand_over_end(&mut self.m) {
            Ok(HandOver::Done { generation }) => {
                tracing::debug!(
                    released_us = released.as_micros() as u64,
                    absorbed_us = absorbed.as_micros() as u64,
                    claimed_us = stopped.elapsed().as_micros() as u64,
                    "handover: the held outputs released, what came after taken in, the backup's claim seen"
                );
                // Nothing more leaves this side: its stream has ended.
                self.halted = true;
                let millis = stopped.elapsed().as_millis() as u64;
                eprintln!(
                    "ftvm: handed over: the backup went live for generation {generation}, {millis} ms after the guest stopped here"
                );
                answer(Ok(Reply::HandedOver { generation, millis }));
                return Ok(Next::Exit(0));
            }
            Ok(HandOver::Kept(alone)) => {
                self.run_alone(alone);
                answer(Err(ControlError::HandOverFailed(
                    "the backup failed during the handover; this side runs on unprotected".into(),
                )));
                Next::Continue
            }
            Err(e @ ProtectionError::HandOverTimedOut(_)) => {
                eprintln!("ftvm: {e}");
                answer(Err(ControlError::HandOverFailed(e.to_string())));
                Next::Continue
            }
            Err(e) => return Err(e.into()),
        };
        // Running on: the news that waited, now that the outcome is known
        // (a backup declared failed is no one's to contend with any more).
        for ev in later {
            if let Next::Exit(code) = self.handle(ev)? {
                return Ok(Next::Exit(code));
            }
        }
        Ok(next)
    }

    /// Protection stops on purpose, the machine standing where inputs may
    /// be delivered (before `before_run` closes what the stream owes
    /// there: the stream's end closes it instead).
    fn unprotect(&mut self) -> Result<(), VmmError> {
        let reply = self.unprotect_asked.take();
        let p = self.primary.take().expect("asked of a protected VM");
        let why = "stopped by unprotect during the transfer".to_string();
        answer(self.protect_reply.take().as_ref(), Err(ControlError::ProtectFailed(why)));
        match p.unprotect(&mut self.m) {
            Ok(alone) => {
                let released = alone.outputs.len() as u64;
                self.run_alone(alone);
                answer(reply.as_ref(), Ok(Reply::Unprotected { released }));
                Ok(())
            }
            Err(e) => {
                // The backup went live: this side halts, releasing nothing.
                self.halted = true;
                answer(reply.as_ref(), Err(ControlError::ProtectFailed(e.to_string())));
                Err(e.into())
            }
        }
    }

    /// A transfer's final pause: the machine stops, the I/O in flight
    /// finishes and its completions go in (the backup's machine, restored
    /// from this state, could not issue it again), and the transfer hands
    /// over to the pair it starts. What else arrives meanwhile waits.
    fn succeed(&mut self, events: &Receiver<HostEvent>) -> Result<Next, VmmError> {
        let stopped = Instant::now();
        let mut later = Vec::new();
        let until = stopped + QUIESCE_MOST;
        let quiet = loop {
            let requests = self.m.take_io_requests();
            self.dispatch(requests);
            if !self.m.io_pending() {
                break true;
            }
            self.io.drain();
            let wait = until.saturating_duration_since(Instant::now());
            match events.recv_timeout(wait) {
                Ok(ev @ HostEvent::Io(..)) => {
                    self.handle(ev)?;
                }
                Ok(ev) => later.push(ev),
                Err(_) => break false,
            }
        };
        let reply = self.protect_reply.take();
        let answer = |r: Result<Reply, ControlError>| answer(reply.as_ref(), r);
        // A move's old pair is ended once the new backup holds the machine.
        let (transfer, mut old) = match self.moving.take() {
            Some(t) => (t, self.primary.take()),
            None => (self.primary.take().expect("a transfer is under way"), None),
        };
        let moved = old.is_some();
        // What the old pair held, once it has ended (its backup stopped, or
        // its generation won): it goes, the new pair started or not.
        let mut released: Option<Alone> = None;
        let mut old_lost = false;
        let result = if quiet {
            let mut end_old = |m: &mut E| -> Result<(), ProtectionError> {
                if let Some(p) = old.take() {
                    released = Some(p.unprotect(m).inspect_err(|_| old_lost = true)?);
                }
                Ok(())
            };
            transfer.succeed(&mut self.m, &mut end_old)
        } else {
            drop(transfer);
            Err(ProtectionError::QuiesceTimedOut(QUIESCE_MOST))
        };
        if old_lost {
            // Its backup went live first: this side halts, releasing
            // nothing (the transfer returned the old pair's error).
            self.halted = true;
            let e = result.err().unwrap_or(ProtectionError::NoTransfer);
            answer(Err(ControlError::ProtectFailed(e.to_string())));
            return Err(e.into());
        }
        match result {
            Ok((pair, done)) => {
                self.primary = Some(pair);
                self.opts.ft_alone = false;
                self.cpu_limit_unsent = self.opts.cpu_limit.is_some();
                let pause_ms = stopped.elapsed().as_millis() as u64;
                let mode = self.protect_mode;
                eprintln!(
                    "ftvm: protected ({mode}, generation {}){}: the machine went across in {} rounds, {} pages \
                     ({:.1} MiB), the last {} in a final pause of {pause_ms} ms; {} ms in all",
                    done.generation,
                    if moved { ", the backup moved" } else { "" },
                    done.rounds,
                    done.pages,
                    done.bytes as f64 / (1 << 20) as f64,
                    done.final_pages,
                    done.total.as_millis()
                );
                if let Some(Alone { outputs, inputs }) = released {
                    self.io.dispatch(outputs);
                    for ev in inputs {
                        self.inject(ev);
                    }
                }
                // The pause as the guest felt it: the loop's part too.
                let transfer = TransferFigures { pause_ms, ..done.figures() };
                answer(Ok(Reply::Protected { generation: done.generation, mode, transfer }));
            }
            Err(e) => {
                match (released, old) {
                    // The old pair ended but the new did not start.
                    (Some(alone), _) => {
                        eprintln!("ftvm: protection failed: {e}; the VM runs on unprotected");
                        self.run_alone(alone);
                    }
                    // The move failed before the old pair ended: it goes on.
                    (None, Some(p)) => {
                        eprintln!("ftvm: moving the backup failed: {e}; the pair in force goes on");
                        self.primary = Some(p);
                    }
                    (None, None) => eprintln!("ftvm: protection failed: {e}; the VM runs on unprotected"),
                }
                answer(Err(ControlError::ProtectFailed(e.to_string())));
            }
        }
        for ev in later {
            if let Next::Exit(code) = self.handle(ev)? {
                return Ok(Next::Exit(code));
            }
        }
        Ok(Next::Continue)
    }

    /// Hands requests to the host; under protection, outputs wait for the
    /// backup's acknowledgement of what produced them.
    fn dispatch(&mut self, requests: Vec<(usize, IoRequest)>) {
        // A move's transfer sees every request first (it mirrors disk
        // writes, where the new backup keeps its own disks) and holds none.
        let requests = match &mut self.moving {
            Some(t) => t.gate(requests, self.m.icount()),
            None => requests,
        };
        let out = match &mut self.primary {
            Some(p) => p.gate(requests, self.m.icount()),
            None => requests,
        };
        if !out.is_empty() {
            self.io.dispatch(out);
        }
    }

    /// After a run: a checkpoint when one is due, and the pause the
    /// primary asks for to keep its backup near or the CPU limit asks
    /// for, the longer (one rest serves both).
    fn after_slice(&mut self, busy: Duration, idle: bool) -> Result<(), VmmError> {
        if let Some(t) = &mut self.moving {
            t.after_slice(&mut self.m, busy, idle)?;
        }
        let for_pair = match &mut self.primary {
            Some(p) => p.after_slice(&mut self.m, busy, idle)?,
            None => Duration::ZERO,
        };
        let share = self.opts.cpu_limit.map_or(1.0, |p| p as f64 / 100.0);
        let for_limit = self.cpu_duty.pause_after(share, busy);
        let pause = for_pair.max(for_limit);
        if !pause.is_zero() {
            let started = Instant::now();
            std::thread::sleep(pause);
            let slept = started.elapsed();
            self.cpu_duty.paused(slept);
            if let (Some(p), false) = (&mut self.primary, for_pair.is_zero()) {
                p.paused(slept);
            }
        }
        Ok(())
    }

    /// Sends CPU limit `percent` (100: none) to the backup as a control
    /// entry, the backup's VM to run under it once it goes live: true if
    /// sent. A pair still being set up has no backup to take it yet: it
    /// is sent after a later run (`cpu_limit_unsent`), as it is whenever
    /// a pair starts.
    fn send_cpu_limit(&mut self, percent: u8) -> bool {
        let Some(p) = &mut self.primary else { return false };
        self.cpu_limit_unsent = false;
        match p.control(&mut self.m, ControlEntry::CpuLimit(percent)) {
            Ok(()) => true,
            Err(ProtectionError::NoBackupToControl) => {
                self.cpu_limit_unsent = true;
                false
            }
            Err(e) => {
                eprintln!("ftvm: the VM's CPU limit could not be sent to the backup: {e}");
                false
            }
        }
    }

    fn control(&mut self, req: ControlRequest) -> Result<Next, VmmError> {
        tracing::debug!(request = ?req.request, "control request");
        let (response, next) = match req.request {
            Request::Status => {
                let pair = match &mut self.primary {
                    Some(p) => p.status(),
                    None if self.opts.ft_alone => Some(PairStatus::Unprotected),
                    None => None,
                };
                let status = VmStatus {
                    state: if self.paused { RunState::Paused } else { RunState::Running },
                    icount: self.m.icount(),
                    guest_time_s: Some(self.m.time() as f64 / TIMEBASE_HZ as f64),
                    pair,
                    cpu_limit_percent: self.opts.cpu_limit,
                };
                (Ok(Reply::Status(Box::new(status))), Next::Continue)
            }
            // A paused primary falls silent, and its backup would take
            // the silence for a failure and go live.
            Request::Pause if self.primary.as_ref().is_some_and(|p| !p.may_pause()) => {
                (Err(ControlError::ProtectedCannotPause), Next::Continue)
            }
            Request::Pause => {
                if !self.paused {
                    self.paused_at = Some(Instant::now());
                }
                self.paused = true;
                (Ok(Reply::Paused), Next::Continue)
            }
            Request::Resume => {
                if self.paused {
                    self.paused = false;
                    // A pause does not count against --exec's limits.
                    if let Some(at) = self.paused_at.take() {
                        let paused = at.elapsed();
                        for t in [&mut self.boot_deadline, &mut self.command_deadline].into_iter().flatten() {
                            *t = t.checked_add(paused).unwrap_or(*t);
                        }
                    }
                    // The pause is not guest time: pacing starts afresh.
                    self.pacer = self.fresh_pacer();
                    while let Some((slot, completion)) = self.held.pop_front() {
                        self.inject(Event::Io { slot, completion });
                    }
                }
                (Ok(Reply::Running), Next::Continue)
            }
            Request::Snapshot { path, overwrite } => (self.snapshot(&path, overwrite), Next::Continue),
            Request::Handover if self.primary.is_none() => (Err(ControlError::NotProtected), Next::Continue),
            Request::Handover if self.hand_over_asked.is_some() || self.unprotect_asked.is_some() => {
                (Err(ControlError::HandOverUnderWay), Next::Continue)
            }
            Request::Handover => {
                // Answered once it is done (or has failed).
                self.hand_over_asked = Some(Some(req.reply));
                return Ok(Next::Continue);
            }
            Request::Protect(_) if self.protector.is_none() => (Err(ControlError::NotProtectable), Next::Continue),
            // Protected already: the backup moves to the host given.
            Request::Protect(_) if self.protect_reply.is_some() || self.moving.is_some() => {
                (Err(ControlError::AlreadyProtected), Next::Continue)
            }
            Request::Protect(_) if self.paused => (Err(ControlError::ProtectPaused), Next::Continue),
            Request::Protect(_) if self.io.activating() => (Err(ControlError::Activating), Next::Continue),
            Request::Protect(args) => {
                let protector = self.protector.as_mut().expect("checked above");
                self.protect_mode = args.mode;
                match protector.start(&self.m, &self.io, *args, self.io.events()) {
                    Ok(()) => {
                        // Answered once the pair has started (or not).
                        self.protect_reply = Some(req.reply);
                        return Ok(Next::Continue);
                    }
                    Err(e) => (Err(e), Next::Continue),
                }
            }
            Request::Unprotect if self.primary.is_none() => (Err(ControlError::NotProtected), Next::Continue),
            Request::Unprotect if self.unprotect_asked.is_some() || self.hand_over_asked.is_some() => {
                (Err(ControlError::StopUnderWay), Next::Continue)
            }
            Request::Unprotect => {
                // Answered once it is done, where inputs may be delivered.
                self.unprotect_asked = Some(req.reply);
                return Ok(Next::Continue);
            }
            Request::Timeout { .. } | Request::CpuLimit { .. }
                if self.unprotect_asked.is_some() || self.hand_over_asked.is_some() =>
            {
                (Err(ControlError::StopUnderWay), Next::Continue)
            }
            Request::CpuLimit { percent } => {
                self.opts.cpu_limit = (percent < 100).then_some(percent);
                self.cpu_duty = DutyCycle::default();
                let sent = self.send_cpu_limit(percent);
                if !sent {
                    eprintln!("ftvm: the VM's CPU limit is {percent} % of a host core");
                }
                (Ok(Reply::CpuLimitSet { percent, sent }), Next::Continue)
            }
            Request::Timeout { ms } => match self.primary.as_mut() {
                None => (Err(ControlError::NotProtected), Next::Continue),
                Some(p) => match p.control(&mut self.m, ControlEntry::Timeout(Duration::from_millis(ms))) {
                    Ok(()) => (Ok(Reply::TimeoutSet { timeout_ms: ms }), Next::Continue),
                    // A pair still being set up: protected once it has.
                    Err(ProtectionError::NoBackupToControl) => (Err(ControlError::NotProtected), Next::Continue),
                    Err(e) => (Err(ControlError::BadRequest(e.to_string())), Next::Continue),
                },
            },
            // A script must not take an `--exec` run cut short for a success.
            Request::Quit if self.exec.as_ref().is_some_and(|e| !e.command_finished()) => {
                let _ = req.reply.send(Response::Ok(Reply::Quitting));
                return Err(VmmError::ExecQuit);
            }
            Request::Quit => (Ok(Reply::Quitting), Next::Exit(0)),
            // The socket streams events itself, from the journal, and
            // attaches consoles to the hub.
            Request::Events | Request::Console { .. } => (
                Err(ControlError::BadRequest("events and the console are streamed by the socket".into())),
                Next::Continue,
            ),
        };
        let _ = req.reply.send(match response {
            Ok(reply) => Response::Ok(reply),
            Err(e) => Response::Error(e),
        });
        Ok(next)
    }

    fn snapshot(&mut self, path: &std::path::Path, overwrite: bool) -> Result<Reply, ControlError> {
        let t0 = Instant::now();
        if !path.is_absolute() {
            return Err(ControlError::RelativePath(path.to_path_buf()));
        }
        // The file goes into place by a rename, which would put a
        // snapshot where one of the VM's disks was: its data gone.
        let same = |disk: &std::path::Path| same_file(disk, path);
        if let Some(disk) = self.io.disk_paths().find(|d| same(d)) {
            return Err(ControlError::OntoDisk(disk.to_path_buf()));
        }
        if path.exists() && !overwrite {
            return Err(ControlError::WouldOverwrite(path.to_path_buf()));
        }
        let failed = |e: &dyn std::error::Error| ControlError::SnapshotFailed(e.to_string());
        let machine = self.m.snapshot().map_err(|e| failed(&e))?;
        snapshot_file::write(path, self.io.describe().as_bytes(), &machine).map_err(|e| failed(&e))?;
        for k in &self.opts.disk_keepers {
            k.keep(format!("the snapshot {} uses it", path.display()));
        }
        // The time spent writing is not guest time.
        self.pacer = self.fresh_pacer();
        Ok(Reply::Snapshot {
            path: path.to_path_buf(),
            icount: self.m.icount(),
            millis: t0.elapsed().as_millis() as u64,
        })
    }

    /// Every input goes through here: applied to the machine and, when
    /// recording, logged at the instruction where it took effect. Where
    /// the primary delivers no inputs (inside an epoch) it waits instead.
    fn inject(&mut self, ev: Event) {
        let ev = match &mut self.primary {
            Some(p) => match p.input(self.m.icount(), ev) {
                Some(ev) => ev,
                None => return,
            },
            None => ev,
        };
        self.injected += 1;
        self.m.inject(ev);
    }

    /// SIGTERM or SIGINT on a VM alone: the guest is asked to power off
    /// (see [`Stopping`]). A second signal, or one while the VM is paused
    /// (its guest could not answer), stops it at once.
    fn stop(&mut self, signal: i32) -> Result<Next, VmmError> {
        let name = crate::signals::name(signal);
        let status = 128 + signal as u32;
        if self.stopping.is_some() || self.paused || self.opts.stop_timeout.is_zero() {
            let why = match () {
                _ if self.stopping.is_some() => "a second signal",
                _ if self.paused => "the VM is paused",
                _ => "--stop-timeout 0",
            };
            eprintln!("ftvm: {name}: stopping the guest now ({why}), exit status {status}");
            // Its disks are flushed as after a clean stop.
            let now = Instant::now();
            self.stopping =
                Some(Stopping { signal, deadline: now, keys: VecDeque::new(), last_key_at: now, cut_short: false });
            return Ok(Next::Exit(status));
        }
        let grace = self.opts.stop_timeout;
        eprintln!(
            "ftvm: {name}: asking the guest to power off (SysRq on its console: SIGTERM to its processes, \
             sync, remount read-only, power off); \
             it is stopped in {} s if it has not (exit status {status}), or at once on a second signal",
            grace.as_secs_f64()
        );
        let now = Instant::now();
        self.stopping = Some(Stopping {
            signal,
            deadline: now.checked_add(grace).unwrap_or(now + Duration::from_secs(86400 * 365)),
            keys: STOP_KEYS.into_iter().collect(),
            last_key_at: now,
            cut_short: self.exec.as_ref().is_some_and(|e| !e.command_finished()),
        });
        Ok(Next::Continue)
    }

    fn feed_inputs(&mut self) {
        if self.paused {
            return;
        }
        let n = self.pending.len().min(self.m.console_room());
        if n > 0 {
            let bytes = self.pending.drain(..n).collect();
            self.inject(Event::ConsoleInput(bytes));
        }
        // A clean stop's next SysRq key: a break, which the UART takes only
        // with nothing else waiting to be read, then the key.
        let now = Instant::now();
        if let Some(stop) = &mut self.stopping {
            let due = stop.keys.front().is_some_and(|&(_, after)| now >= stop.last_key_at + after);
            if due && self.m.console_room() == ftvm_machine::CONSOLE_CAPACITY {
                let (key, _) = stop.keys.pop_front().expect("due");
                stop.last_key_at = now;
                self.inject(Event::ConsoleBreak);
                self.inject(Event::ConsoleInput(vec![key]));
            }
        }
        while let Some(ev) = self.io.next_frame(&self.m) {
            self.inject(ev);
        }
    }

    fn show_output(&mut self) {
        let out = self.m.take_console_output();
        if out.is_empty() {
            return;
        }
        self.opts.console.publish(&out);
        let seen = self.watch.feed(&out);
        if let (Some(line), None) = (seen.panic, &self.panicked) {
            self.panicked = Some((line, Instant::now(), false));
        }
        if let (true, Some((_, _, ended))) = (seen.panic_ended, &mut self.panicked) {
            *ended = true;
        }
        let (stdout, stderr) = match &mut self.exec {
            Some(exec) => {
                let shown = exec.feed(&out);
                // The protocol's answers (the nonce, chunks) go in as typed input.
                self.pending.extend(exec.take_to_guest());
                if shown.began && self.boot_deadline.take().is_some() && self.command_deadline.is_none() {
                    self.command_deadline =
                        self.opts.limits.and_then(|l| l.command).and_then(|c| Instant::now().checked_add(c));
                }
                (shown.stdout, shown.stderr)
            }
            None => (out, Vec::new()),
        };
        if !stdout.is_empty() {
            let mut lock = std::io::stdout().lock();
            let _ = lock.write_all(&stdout);
            let _ = lock.flush();
        }
        if !stderr.is_empty() {
            let mut lock = std::io::stderr().lock();
            let _ = lock.write_all(&stderr);
            let _ = lock.flush();
        }
    }
}

/// Answers a request that waited for its outcome (if anyone asked).
fn answer(to: Option<&Sender<Response>>, r: Result<Reply, ControlError>) {
    if let Some(tx) = to {
        let _ = tx.send(match r {
            Ok(reply) => Response::Ok(reply),
            Err(e) => Response::Error(e),
        });
    }
}

/// Whether `a` and `b` name the same file: by device and inode where both
/// exist (links and `..` included), else never.
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}
