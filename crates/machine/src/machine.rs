//! The machine: harts, RAM, board and virtual clock, driven through one
//! narrow interface (run to instruction N, inject an event, snapshot,
//! restore, dirty pages). Its execution is a pure function of its start
//! state and the events injected into it, at the instruction counts where
//! they were injected.
//!
//! Several harts share one host thread in a fixed round-robin of quanta.
//! The schedule depends only on machine state, never on where a caller
//! asked `run_until` to stop: a hart's unfinished quantum carries over.
//! A machine that need not repeat its run runs them on their own threads
//! instead ([`Machine::set_parallel`], `crate::parallel`).

use crate::board::{Board, BoardError, HartBus, PowerRequest};
use crate::clock::VirtualClock;
use crate::digest::{hash8, StateDigest};
use crate::fdt::FdtError;
use crate::layout::{RAM_BASE, TIMEBASE_HZ};
use crate::loader::{self, LoadError};
use crate::snapshot::StateError;
use ftvm_cpu::{Exit, Extensions, Hart};
use ftvm_devices::{IoCompletion, IoRequest};
use ftvm_memory::{GuestRam, RamAllocError};

/// Steps a hart runs before the next one gets its turn (with one hart, slices
/// are not cut at all: see `Machine::run_until`).
pub const QUANTUM: u64 = 10_000;

/// Nominal guest speed the clock starts from (instructions per second of
/// guest time). A live host corrects it with `Event::ClockRate`.
pub const DEFAULT_GUEST_IPS: u64 = 200_000_000;

/// A virtio device of the board. Slots are filled in the order given.
/// The machine knows only what the guest can see of a device: where its
/// data lives is the host's business.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSpec {
    /// A disk of `size` bytes (whole 512-byte sectors of it are exposed).
    Disk {
        size: u64,
        readonly: bool,
    },
    Net {
        mac: [u8; 6],
    },
    Rng,
}

#[derive(Debug, Clone)]
pub struct MachineConfig {
    pub harts: usize,
    pub ram_size: u64,
    pub firmware: Option<Vec<u8>>,
    pub kernel: Vec<u8>,
    pub initrd: Option<Vec<u8>>,
    pub cmdline: String,
    pub devices: Vec<DeviceSpec>,
    pub guest_ips: u64,
    /// The wall time at power-on, in ns since the Unix epoch: the RTC
    /// shows it plus the virtual time elapsed since. The host chooses it
    /// (its clock when the VM is created); the machine never reads a clock.
    pub rtc_base_ns: u64,
    /// The optional extensions the harts implement (and the device tree
    /// advertises): [`Extensions::ALL`] for a new machine, what a log or
    /// snapshot names for one that replays or restores.
    pub extensions: Extensions,
    /// The VM's own settings for its guest (host name, ssh keys, ...: lines
    /// `key=value`, read by the guest's setup at boot), handed over in the
    /// device tree's /chosen node, the way cloud-init's NoCloud hands a
    /// seed over on a disk: part of the machine, so a replay and a backup
    /// boot with the same one.
    pub seed: Option<String>,
}

impl MachineConfig {
    /// One hart, `ram_size` bytes of RAM, no firmware and no devices but
    /// the entropy source: `program` runs from RAM's base in M-mode (the
    /// machine's own tests of what a hart does on the board).
    pub fn bare_metal(program: Vec<u8>, ram_size: u64) -> MachineConfig {
        MachineConfig {
            harts: 1,
            ram_size,
            firmware: None,
            kernel: program,
            initrd: None,
            cmdline: String::new(),
            devices: vec![DeviceSpec::Rng],
            guest_ips: DEFAULT_GUEST_IPS,
            rtc_base_ns: 0,
            extensions: Extensions::ALL,
            seed: None,
        }
    }
}

/// An input from outside, applied at the current instruction boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Bytes typed on the console.
    ConsoleInput(Vec<u8>),
    /// A break on the console line (a serial console's "send break"),
    /// offered only while the console has nothing left to read
    /// ([`Machine::console_room`] is the whole buffer). Linux takes it,
    /// with the key that follows, as a magic SysRq.
    ConsoleBreak,
    /// New clock rate (timer ticks per instruction, scaled by 2^32).
    ClockRate(u64),
    /// While idle: move the timer forward to this many ticks.
    ClockAdvance(u64),
    /// A completion of a request the device in virtio `slot` issued, or
    /// input for it (a received frame).
    Io { slot: usize, completion: IoCompletion },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunExit {
    /// The instruction count reached the target.
    Reached,
    /// Every hart waits for an interrupt. `wake_at` is the timer value at
    /// which a timer interrupt will wake one, if any is armed.
    Idle { wake_at: Option<u64> },
    /// The guest asked to power off with this exit status.
    PowerOff(u32),
    /// The guest asked to reboot.
    Reset,
    /// Devices issued requests for the host ([`Machine::take_io_requests`]).
    /// Stopping here changes nothing in the machine: run on when ready.
    Io,
}

/// Why a machine cannot be built, saved or restored.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    #[error("--cpus must be between 1 and 8, not {0}")]
    Harts(usize),
    #[error("memory size {} MiB is outside 16 MiB..64 GiB", .0 >> 20)]
    RamSize(u64),
    #[error(transparent)]
    Ram(#[from] RamAllocError),
    #[error(transparent)]
    Board(#[from] BoardError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("device tree: {0}")]
    DeviceTree(#[source] FdtError),
    /// Requests the host has not taken would be lost; `doing`: "snapshot"
    /// or "checkpoint".
    #[error("take the pending I/O requests before a {doing}")]
    PendingIo { doing: &'static str },
    #[error("machine state: {0}")]
    State(#[source] StateError),
    #[error("machine state has {0} harts")]
    StateHarts(usize),
    #[error("machine state: hart {index} has id {id}")]
    HartId { index: usize, id: u64 },
    #[error("machine state: scheduler position out of range")]
    Scheduler,
    #[error(
        "machine state wants {} MiB of RAM at {:#x}, given {} MiB at {:#x}",
        .saved_size >> 20, .saved_base, .given_size >> 20, .given_base
    )]
    OtherRam { saved_base: u64, saved_size: u64, given_base: u64, given_size: u64 },
}

pub struct Machine {
    /// The RAM hash of the previous [`Machine::state_digest`], chained
    /// into the next.
    last_ram_digest: [u8; 8],
    devices: Vec<DeviceSpec>,
    harts: Vec<Hart>,
    ram: GuestRam,
    board: Board,
    clock: VirtualClock,
    icount: u64,
    current: usize,
    quantum_left: u64,
    /// Whether the harts run on their own host threads (see
    /// [`Machine::set_parallel`]).
    parallel: bool,
    /// See [`Machine::run_cpu_time`].
    run_cpu: Option<std::time::Duration>,
    /// The threads parallel harts run on, made when first needed.
    hart_threads: Option<crate::parallel::HartThreads>,
}

impl Machine {
    pub fn new(cfg: &MachineConfig) -> Result<Machine, MachineError> {
        if cfg.harts == 0 || cfg.harts > 8 {
            return Err(MachineError::Harts(cfg.harts));
        }
        if cfg.ram_size < 16 << 20 || cfg.ram_size > 64 << 30 {
            return Err(MachineError::RamSize(cfg.ram_size));
        }
        let mut ram = GuestRam::new(RAM_BASE, cfg.ram_size)?;
        let board = Board::new(cfg.harts, &cfg.devices, cfg.rtc_base_ns)?;
        let (plan, _) = loader::plan(&ram, cfg.firmware.as_deref(), &cfg.kernel, cfg.initrd.as_deref())?;
        let fdt = crate::fdt::build_fdt(&crate::fdt::FdtConfig {
            harts: cfg.harts,
            ram_base: RAM_BASE,
            ram_size: ram.size(),
            cmdline: cfg.cmdline.clone(),
            initrd: plan.initrd,
            timebase_freq: TIMEBASE_HZ,
            virtio: board.virtio_windows(),
            extensions: cfg.extensions,
            seed: cfg.seed.clone(),
        })
        .map_err(MachineError::DeviceTree)?;
        loader::load(&mut ram, &plan, cfg.firmware.as_deref(), &cfg.kernel, cfg.initrd.as_deref(), &fdt)?;
        let mut harts = Vec::with_capacity(cfg.harts);
        for id in 0..cfg.harts {
            let mut h = Hart::new(id as u64);
            h.s.ext = cfg.extensions;
            h.s.pc = plan.entry;
            h.s.x[10] = id as u64;
            h.s.x[11] = plan.fdt_addr;
            h.s.x[12] = plan.fw_dynamic_info.unwrap_or(0);
            harts.push(h);
        }
        // Loading the images is not guest activity.
        ram.take_dirty();
        Ok(Machine {
            last_ram_digest: [0; 8],
            devices: cfg.devices.clone(),
            harts,
            ram,
            board,
            clock: VirtualClock::new(VirtualClock::rate_for(cfg.guest_ips, TIMEBASE_HZ)),
            icount: 0,
            current: 0,
            quantum_left: QUANTUM,
            parallel: false,
            run_cpu: None,
            hart_threads: None,
        })
    }

    /// The virtio devices, in slot order.
    pub fn devices(&self) -> &[DeviceSpec] {
        &self.devices
    }

    /// The complete machine state at this instruction boundary: harts,
    /// RAM, devices (with I/O in flight), virtual clock and scheduler
    /// position. Requests not yet taken by the host would be lost, so they
    /// must be taken first. The dirty map is not part of it.
    pub fn snapshot(&self) -> Result<Vec<u8>, MachineError> {
        if self.board.has_io_requests() {
            return Err(MachineError::PendingIo { doing: "snapshot" });
        }
        Ok(crate::snapshot::encode_machine(&self.parts()))
    }

    /// A machine in exactly the state [`Machine::snapshot`] saved. I/O
    /// that was in flight is reported by [`Machine::io_in_flight`] and must
    /// be issued again by the host.
    pub fn restore(bytes: &[u8]) -> Result<Machine, MachineError> {
        let (d, ram) = crate::snapshot::decode_machine(bytes).map_err(MachineError::State)?;
        Machine::assemble(d, ram)
    }

    /// The size of the RAM the state `bytes` (as [`Machine::snapshot`]
    /// saves it) declares, read without allocating it: what a host checks
    /// against what it can give before [`Machine::restore`].
    pub fn snapshot_ram(bytes: &[u8]) -> Result<u64, MachineError> {
        crate::snapshot::machine_ram(bytes).map_err(MachineError::State)
    }

    /// The machine's state without the contents of its RAM: what a
    /// checkpoint carries beside the pages written since the last one
    /// ([`Machine::take_dirty_pages`]). As with [`Machine::snapshot`], the
    /// pending I/O requests must be taken first.
    pub fn checkpoint_state(&self) -> Result<Vec<u8>, MachineError> {
        if self.board.has_io_requests() {
            return Err(MachineError::PendingIo { doing: "checkpoint" });
        }
        Ok(crate::snapshot::encode_state(&self.parts()))
    }

    /// Makes ahead of time what the first instructions of the next
    /// machine built in this process, with `harts` harts, would otherwise
    /// wait for: their block tables, their memory touched. For a side that
    /// builds its machine at a moment that counts (a checkpoint backup
    /// going live), and has time before it.
    pub fn prepare_harts(harts: usize) {
        ftvm_cpu::prepare_block_tables(harts);
    }

    /// The machine [`Machine::checkpoint_state`] saved, with `ram` holding
    /// what its RAM held then. I/O in flight is issued again, as after
    /// [`Machine::restore`].
    pub fn from_checkpoint(state: &[u8], ram: GuestRam) -> Result<Machine, MachineError> {
        let d = crate::snapshot::decode_state(state).map_err(MachineError::State)?;
        if (d.ram_base, d.ram_size) != (ram.base(), ram.size()) {
            return Err(MachineError::OtherRam {
                saved_base: d.ram_base,
                saved_size: d.ram_size,
                given_base: ram.base(),
                given_size: ram.size(),
            });
        }
        Machine::assemble(d, ram)
    }

    fn parts(&self) -> crate::snapshot::MachineParts<'_> {
        crate::snapshot::MachineParts {
            devices: &self.devices,
            ram: &self.ram,
            harts: self.harts.iter().map(|h| crate::snapshot::hart_bytes(&h.s)).collect(),
            board: self.board.snapshot_bytes(),
            icount: self.icount,
            clock: self.clock.to_parts(),
            current: self.current as u64,
            quantum_left: self.quantum_left,
        }
    }

    fn assemble(d: crate::snapshot::DecodedState, ram: GuestRam) -> Result<Machine, MachineError> {
        let bad = MachineError::State;
        let nharts = d.harts.len();
        if nharts == 0 || nharts > 8 {
            return Err(MachineError::StateHarts(nharts));
        }
        // The RTC's base comes with the rest of its state.
        let mut board = Board::new(nharts, &d.devices, 0)?;
        board.restore_bytes(&d.board).map_err(bad)?;
        let mut harts = Vec::with_capacity(nharts);
        for (i, hb) in d.harts.iter().enumerate() {
            let st = crate::snapshot::hart_from_bytes(hb).map_err(bad)?;
            if st.id != i as u64 {
                return Err(MachineError::HartId { index: i, id: st.id });
            }
            harts.push(Hart::from_state(st));
        }
        let (a, b, c) = d.clock;
        if d.current >= nharts as u64 || d.quantum_left > QUANTUM {
            return Err(MachineError::Scheduler);
        }
        Ok(Machine {
            last_ram_digest: [0; 8],
            devices: d.devices,
            harts,
            ram,
            board,
            clock: VirtualClock::from_parts(a, b, c),
            icount: d.icount,
            current: d.current as usize,
            quantum_left: d.quantum_left,
            parallel: false,
            run_cpu: None,
            hart_threads: None,
        })
    }

    /// Steps executed since power-on (instructions retired plus traps
    /// taken, over all harts).
    pub fn icount(&self) -> u64 {
        self.icount
    }

    /// The platform timer now.
    pub fn time(&self) -> u64 {
        self.clock.ticks_at(self.icount)
    }

    pub fn clock(&self) -> &VirtualClock {
        &self.clock
    }

    /// The wall time (ns since the Unix epoch) the RTC shows when the
    /// virtual timer reads zero: with the virtual clock, all the guest's
    /// date depends on.
    pub fn rtc_base_ns(&self) -> u64 {
        self.board.rtc_base()
    }

    /// Sets what [`Machine::rtc_base_ns`] returns: a replay or a backup
    /// takes the value its primary chose.
    pub fn set_rtc_base_ns(&mut self, base: u64) {
        self.board.set_rtc_base(base);
    }

    /// The wall time (ns since the Unix epoch) the RTC shows now.
    pub fn rtc_now_ns(&self) -> u64 {
        self.board.rtc_now(self.time())
    }

    /// Sets the RTC to show `now` (ns since the Unix epoch) at this
    /// instruction: a host's decision, when it restores a snapshot taken
    /// at another time, that the guest should find the host's date.
    pub fn set_rtc_now_ns(&mut self, now: u64) {
        self.board.set_rtc_now(self.time(), now);
    }

    /// The threads the harts run on beside the caller's, once parallel.
    #[cfg(test)]
    pub(crate) fn hart_threads(&self) -> Option<&crate::parallel::HartThreads> {
        self.hart_threads.as_ref()
    }

    pub fn harts(&self) -> &[Hart] {
        &self.harts
    }

    /// The optional extensions the harts implement (all alike).
    pub fn extensions(&self) -> Extensions {
        self.harts[0].s.ext
    }

    pub fn ram(&self) -> &GuestRam {
        &self.ram
    }

    /// Apply an input at the current instruction boundary. Returns false
    /// when it had no effect (an I/O completion the device does not wait
    /// for, a frame with no receive buffer).
    ///
    /// Console input beyond [`Machine::console_room`] and frames offered
    /// while [`Machine::input_ready`] is false are not taken: hosts hold
    /// them back and offer them later, so that an event always carries
    /// exactly what the guest received.
    pub fn inject(&mut self, ev: Event) -> bool {
        match ev {
            Event::ConsoleInput(bytes) => {
                let taken = self.board.console_input(&bytes);
                debug_assert_eq!(taken, bytes.len(), "console input beyond console_room() was dropped");
                taken > 0
            }
            Event::ConsoleBreak => {
                let taken = self.board.console_break();
                debug_assert!(taken, "a console break offered with input waiting was dropped");
                taken
            }
            Event::ClockRate(rate) => {
                self.clock.set_rate(self.icount, rate);
                true
            }
            Event::ClockAdvance(ticks) => {
                self.clock.advance_to(self.icount, ticks);
                true
            }
            Event::Io { slot, completion } => self.board.complete_io(slot, completion, &self.ram),
        }
    }

    /// Requests the devices issued for the host since the last call, by
    /// virtio slot, in the order they were issued within a slot.
    pub fn take_io_requests(&mut self) -> Vec<(usize, IoRequest)> {
        self.board.take_io_requests()
    }

    /// Requests the devices still wait for. After a restore (or when a
    /// backup goes live) the host issues these again.
    pub fn io_in_flight(&self) -> Vec<(usize, IoRequest)> {
        self.board.io_in_flight()
    }

    /// Whether any device waits for the host to complete a request.
    pub fn io_pending(&self) -> bool {
        self.board.io_in_flight_count() > 0
    }

    /// Whether the device in `slot` would take input (a frame) now.
    pub fn input_ready(&self, slot: usize) -> bool {
        self.board.input_ready(slot, &self.ram)
    }

    /// How many console input bytes the guest can take now.
    pub fn console_room(&self) -> usize {
        self.board.console_room()
    }

    /// Console bytes the guest wrote since the last call.
    pub fn take_console_output(&mut self) -> Vec<u8> {
        self.board.take_console_output()
    }

    /// Pages (guest-physical page numbers) written since the last call,
    /// by CPU stores and device DMA.
    pub fn take_dirty_pages(&mut self) -> Vec<u64> {
        let pages = self.ram.take_dirty();
        for h in &mut self.harts {
            h.flush_store_tlb();
        }
        pages
    }

    /// A second reader of the pages written (see `GuestRam::start_view`).
    pub fn start_dirty_view(&mut self) {
        self.ram.start_view();
    }

    /// The second reader's pages written since its last take.
    pub fn take_dirty_view(&mut self) -> Vec<u64> {
        let pages = self.ram.take_view();
        // A store TLB entry says "marked": a store through it would not
        // mark the view again.
        for h in &mut self.harts {
            h.flush_store_tlb();
        }
        pages
    }

    /// The second reader is done.
    pub fn end_dirty_view(&mut self) {
        self.ram.end_view();
    }

    pub fn set_dirty_tracking(&mut self, on: bool) {
        self.ram.set_tracking(on);
        for h in &mut self.harts {
            h.flush_store_tlb();
        }
    }

    fn update_interrupts(&mut self) {
        let mtime = self.clock.ticks_at(self.icount);
        for (i, h) in self.harts.iter_mut().enumerate() {
            let mut lines = self.board.irq_bits(i, mtime);
            // Sstc: STIP while time >= stimecmp, as MTIP for mtimecmp.
            if h.stimecmp_deadline().is_some_and(|t| mtime >= t) {
                lines |= ftvm_cpu::csr::MIP_STIP;
            }
            h.set_irq_lines(lines);
        }
    }

    /// The earliest time after `now` at which a timer fires: the board's
    /// (CLINT, RTC) or a hart's stimecmp. Slices end there and an idle
    /// machine wakes there, so a timer interrupt is seen at the same
    /// instruction however a run is split.
    fn next_timer_after(&self, now: u64) -> Option<u64> {
        [self.board.next_timer_deadline_after(now), self.stimecmp_after(now)].into_iter().flatten().min()
    }

    /// The earliest Sstc timer of a hart still ahead of `now` (one passed
    /// already has made STIP pending).
    fn stimecmp_after(&self, now: u64) -> Option<u64> {
        // A stimecmp of all ones, like an mtimecmp, is no timer at all.
        self.harts.iter().filter_map(Hart::stimecmp_deadline).filter(|&t| t > now && t != u64::MAX).min()
    }

    /// Runs the harts on their own host threads (`on`), each on a host
    /// core if there are enough, or all on the caller's thread in the
    /// deterministic round-robin (the default). In parallel, a run is no
    /// longer a function of the state and the events injected: the
    /// instruction at which one hart sees another's store or interrupt
    /// depends on the host's timing, and `run_until` may pass its target
    /// by up to [`crate::parallel::SLICE`] steps a hart. For a VM that is
    /// neither recorded nor replayed (a plain run, a checkpointed
    /// primary); a machine switched back runs deterministically from the
    /// state it is in. Nothing changes with one hart.
    pub fn set_parallel(&mut self, on: bool) {
        // A lone hart has no one to run beside: it stays as it is.
        let on = on && self.harts.len() > 1;
        self.parallel = on;
        if on && self.hart_threads.is_none() {
            self.hart_threads = Some(crate::parallel::HartThreads::new(self.harts.len()));
        }
        for h in &mut self.harts {
            h.set_parallel(on);
        }
    }

    /// Whether the harts run on their own threads ([`Machine::set_parallel`]).
    pub fn parallel(&self) -> bool {
        self.parallel
    }

    /// The host CPU time the last [`Machine::run_until`] took on the hart
    /// thread that spent the most, when the harts ran on threads of their
    /// own; None when the caller's thread ran them all (its own CPU time
    /// says). What a host measures its speed of execution by: less than
    /// the wall time whenever the host took a core away.
    pub fn run_cpu_time(&self) -> Option<std::time::Duration> {
        self.run_cpu
    }

    /// Run until the instruction count reaches `target` or the machine
    /// stops, idles or powers off.
    pub fn run_until(&mut self, target: u64) -> RunExit {
        let n = self.harts.len();
        self.run_cpu = None;
        loop {
            if let Some(req) = self.board.power_request() {
                return match req {
                    PowerRequest::Off(code) => RunExit::PowerOff(code),
                    PowerRequest::Reset => RunExit::Reset,
                };
            }
            if self.board.has_io_requests() {
                return RunExit::Io;
            }
            if self.icount >= target {
                return RunExit::Reached;
            }
            self.update_interrupts();
            let runnable = |h: &Hart| !h.is_idle() || h.wake_pending();
            if !self.harts.iter().any(runnable) {
                // A stimecmp already passed would have woken a hart (STIP
                // is pending): only those ahead can.
                let sstc = self.stimecmp_after(self.clock.ticks_at(self.icount));
                let wake_at = [self.board.next_timer_deadline(), sstc].into_iter().flatten().min();
                return RunExit::Idle { wake_at };
            }
            if let (true, Some(threads)) = (self.parallel, &mut self.hart_threads) {
                // The threads stop where one of them saw a reason to; the
                // checks above take it (or find none and go on).
                let (icount, cpu) = crate::parallel::run(
                    threads,
                    &mut self.harts,
                    &self.ram,
                    &mut self.board,
                    &self.clock,
                    self.icount,
                    target,
                );
                self.icount = icount;
                *self.run_cpu.get_or_insert_default() += cpu;
                continue;
            }
            if self.quantum_left == 0 || !runnable(&self.harts[self.current]) {
                self.current = (self.current + 1) % n;
                self.quantum_left = QUANTUM;
                if n > 1 {
                    // Another hart may have written the reserved address.
                    self.harts[self.current].clear_reservation();
                }
                continue;
            }
            // A lone hart has no one to give its turn to: its slices end
            // only at the target and at timers (and, as every slice, at a
            // device access or WFI). Each slice end costs a pass through
            // this loop and the interpreted tail of a block that does not
            // fit in what is left (10,000-step slices: 1.5 million of
            // them in python's test_math and test_float).
            let mut budget = if n == 1 { target - self.icount } else { self.quantum_left.min(target - self.icount) };
            let now = self.clock.ticks_at(self.icount);
            // End the slice where a timer fires, so the interrupt is seen at
            // the same instruction however the caller splits the run.
            if let Some(deadline) = self.next_timer_after(now) {
                if let Some(at) = self.clock.icount_reaching(deadline) {
                    budget = budget.min(at.saturating_sub(self.icount).max(1));
                }
            }
            let h = &mut self.harts[self.current];
            let mut bus = HartBus::new(&mut self.board, &self.clock, self.icount);
            let (steps, exit) = h.run(&self.ram, &mut bus, budget);
            self.icount += steps;
            // A lone hart's quantum stays whole: counted down by slices
            // that are not cut at it, it would depend on how the run is
            // split into calls (a backup's targets are not its primary's),
            // and it is part of the state the replicas compare.
            if n > 1 {
                self.quantum_left -= steps.min(self.quantum_left);
            }
            // WFI gives up the rest of the quantum even if an interrupt
            // arrives at once: the other harts get their turn first.
            if exit == Exit::Idle && n > 1 {
                self.quantum_left = 0;
            }
        }
    }

    /// Makes the machine what one restored from its checkpoint state is,
    /// so that it and a replica restored from that state run alike from
    /// here: the chain of [`Machine::state_digest`] starts afresh, and the
    /// harts drop their cached translations. (A cached translation is
    /// guest-visible where the guest changes a PTE without `sfence.vma`,
    /// as Linux clears accessed bits: a hart holding one sets no accessed
    /// bit where one walking the tables does, and the replicas' RAM would
    /// differ.)
    pub fn begin_as_restored(&mut self) {
        self.last_ram_digest = [0; 8];
        for h in &mut self.harts {
            h.flush_tlb();
        }
    }

    /// A cheap, chained digest of the machine for replay checks: each
    /// hart, each device, the clock and scheduler now, plus the pages
    /// written since the previous digest (their numbers and contents) and
    /// the previous RAM hash. Two machines fed the same inputs give the
    /// same chain; its cost follows the pages written, not the size of RAM.
    /// It consumes the dirty map (tracking must be on), so it cannot share
    /// a machine with another user of [`Machine::take_dirty_pages`].
    pub fn state_digest(&mut self) -> StateDigest {
        let harts = self.harts.iter().map(|h| hash8(&crate::snapshot::hart_bytes(&h.s))).collect();
        let mut parts: Vec<[u8; 8]> = self.board.named_parts().iter().map(|(_, b)| hash8(b)).collect();
        let mut sched = Vec::with_capacity(48);
        let (a, b, c) = self.clock.to_parts();
        for v in [self.icount, a, b, c, self.current as u64, self.quantum_left] {
            sched.extend_from_slice(&v.to_le_bytes());
        }
        parts.push(hash8(&sched));
        let written = self.take_dirty_pages();
        let mut ram = xxhash_rust::xxh3::Xxh3::new();
        ram.update(&self.last_ram_digest);
        let mut pages = Vec::with_capacity(written.len());
        for &pfn in &written {
            let addr = pfn << ftvm_memory::PAGE_SHIFT;
            let h = hash8(self.ram.slice(addr, ftvm_memory::PAGE_SIZE).unwrap_or(&[]));
            ram.update(&pfn.to_le_bytes());
            ram.update(&h);
            pages.push((pfn, u16::from_le_bytes([h[0], h[1]])));
        }
        let ram = ram.digest().to_le_bytes();
        self.last_ram_digest = ram;
        StateDigest { harts, parts, ram, pages }
    }

    /// What each of [`StateDigest::parts`] is, for mismatch reports.
    pub fn digest_part_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.board.named_parts().into_iter().map(|(n, _)| n).collect();
        names.push("clock and scheduler".to_string());
        names
    }

    /// A hash of the whole machine state: harts, RAM, devices, clock and
    /// instruction count. Equal hashes at equal instruction counts are how
    /// determinism is checked.
    pub fn state_hash(&self) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        h.update(&self.icount.to_le_bytes());
        let (a, b, c) = self.clock.to_parts();
        for v in [a, b, c, self.current as u64, self.quantum_left] {
            h.update(&v.to_le_bytes());
        }
        for hart in &self.harts {
            h.update(&crate::snapshot::hart_bytes(&hart.s));
        }
        h.update(&self.board.snapshot_bytes());
        h.update(self.ram.as_slice());
        *h.finalize().as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine whose kernel spins (`j .`), with `ram` bytes of RAM.
    fn spinning(ram_size: u64) -> Machine {
        Machine::new(&MachineConfig::bare_metal(0x0000_006fu32.to_le_bytes().to_vec(), ram_size)).unwrap()
    }

    /// A run's state does not depend on how it is split into calls of
    /// `run_until` (a backup replays to other targets than its primary
    /// ran to), the scheduler's included, with one hart too.
    #[test]
    fn the_state_does_not_depend_on_how_a_run_is_split() {
        let mut whole = spinning(32 << 20);
        whole.run_until(1_000_000);
        let mut split = spinning(32 << 20);
        for target in [3, 7_777, 10_001, 123_456, 654_321, 999_990, 1_000_000] {
            split.run_until(target);
        }
        assert_eq!(whole.icount(), split.icount());
        assert_eq!(whole.state_hash(), split.state_hash());
    }

    /// What a snapshot declares is read before anything is allocated for
    /// it: a host checks it against what it has (`ftvm run --restore`).
    #[test]
    fn a_snapshot_declares_its_ram_before_it_is_restored() {
        let mut m = spinning(32 << 20);
        m.run_until(100);
        let bytes = m.snapshot().unwrap();
        assert_eq!(Machine::snapshot_ram(&bytes).unwrap(), 32 << 20);
        assert_eq!(Machine::restore(&bytes).unwrap().ram().size(), 32 << 20);
        assert!(matches!(Machine::snapshot_ram(b"MACHjunk"), Err(MachineError::State(_))));
        // The state without RAM is not a whole machine's.
        assert!(Machine::snapshot_ram(&m.checkpoint_state().unwrap()).is_err());
        // The largest a machine may have, with its whole page map (all
        // pages zero): read without allocating 64 GiB.
        assert_eq!(Machine::snapshot_ram(&declaring_ram(&bytes, 64 << 30)).unwrap(), 64 << 30);
    }

    /// The guest's date is the RTC's base plus virtual time, and the base
    /// is state: a snapshot, a checkpoint and the state hash carry it.
    #[test]
    fn the_rtc_base_travels_with_the_state() {
        const BASE: u64 = 1_735_689_600_000_000_000;
        let mut m = spinning(32 << 20);
        m.set_rtc_base_ns(BASE);
        m.run_until(1_000_000);
        assert!(m.time() > 0);
        assert_eq!(m.rtc_now_ns(), BASE + m.time() * 100);
        let r = Machine::restore(&m.snapshot().unwrap()).unwrap();
        assert_eq!((r.rtc_base_ns(), r.rtc_now_ns()), (BASE, m.rtc_now_ns()));
        let ram = GuestRam::new(RAM_BASE, 32 << 20).unwrap();
        let c = Machine::from_checkpoint(&m.checkpoint_state().unwrap(), ram).unwrap();
        assert_eq!(c.rtc_base_ns(), BASE);
        let before = m.state_hash();
        m.set_rtc_now_ns(BASE + 3_600_000_000_000);
        assert_eq!(m.rtc_now_ns(), BASE + 3_600_000_000_000);
        assert_ne!(m.state_hash(), before);
    }

    /// `snapshot`, a whole machine's state, made to declare `size` bytes
    /// of RAM, all zero pages.
    fn declaring_ram(snapshot: &[u8], size: u64) -> Vec<u8> {
        let mut field = crate::layout::RAM_BASE.to_le_bytes().to_vec();
        field.extend_from_slice(&Machine::snapshot_ram(snapshot).unwrap().to_le_bytes());
        let at = snapshot.windows(16).position(|w| w == field).unwrap() + 8;
        let mut out = snapshot[..at].to_vec();
        out.extend_from_slice(&size.to_le_bytes());
        let map = size / ftvm_memory::PAGE_SIZE / 8;
        out.extend_from_slice(&map.to_le_bytes());
        out.resize(out.len() + map as usize, 0);
        out.extend_from_slice(&0u64.to_le_bytes());
        out
    }
}
