//! Harts on their own host threads: how a machine runs when nothing needs
//! its run to be repeatable (a plain VM, a checkpointed primary; see
//! [`crate::Machine::set_parallel`]), as QEMU's MTTCG does.
//!
//! Each hart runs slices of at most [`SLICE`] steps on its own thread,
//! looking at the board between them (its interrupt lines, requests for
//! the host, power, the target) with the board locked; an access to a
//! device locks it too. RAM is shared (see `ftvm_memory`): AMOs, SC and
//! the page walker's A/D bits use the host's atomics, and a page that
//! becomes code waits for the other harts' store TLBs
//! (`Tlb::purge_and_wait`). The instruction count is the sum of what the
//! harts retired, and guest time follows it, never going back from one
//! hart's read to another's (`HartBus::time_floor`).
//!
//! A hart waiting for an interrupt with none pending when a run begins
//! sits it out (no thread is woken for it), watched at every look of the
//! others: the run ends when it would wake, and the next one runs it. So a
//! guest with one busy hart runs it on the caller's thread alone, as one
//! thread would.
//!
//! Every decision to stop is taken again by the caller with all harts
//! stopped (`Machine::run_until`): the threads only say when to look.

use crate::board::{time_at_least, Board, HartBus};
use crate::clock::VirtualClock;
use ftvm_cpu::{Bus, Hart, WakeCondition};
use ftvm_memory::GuestRam;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Steps a hart runs before it looks at the board again: how late it sees
/// an interrupt another hart raised (an IPI) and a request to stop. At
/// this machine's speed, tens of microseconds.
pub const SLICE: u64 = 10_000;

/// What the harts' threads share during one [`run`].
struct Shared<'a> {
    board: Mutex<&'a mut Board>,
    /// The harts that sit this run out, by index, and what wakes each.
    sleepers: Vec<(usize, WakeCondition)>,
    clock: &'a VirtualClock,
    ram: &'a GuestRam,
    /// The harts that run.
    harts: usize,
    target: u64,
    /// The machine's instruction count: every hart's steps added.
    icount: AtomicU64,
    /// The latest time a hart read (see `HartBus::time_floor`).
    time_floor: AtomicU64,
    /// Set when a thread saw a reason to stop: every thread ends at its
    /// next look.
    stop: AtomicBool,
    /// The harts waiting for an interrupt (guarded), woken through `wake`.
    waiting: Mutex<Waiting>,
    wake: Condvar,
    /// The most CPU time one of the threads spent, in ns.
    busiest: AtomicU64,
}

struct Waiting {
    count: usize,
    /// The earliest instruction count at which a timer may wake one of
    /// them (u64::MAX: none).
    until: u64,
}

impl<'a> Shared<'a> {
    fn board(&self) -> MutexGuard<'_, &'a mut Board> {
        // A hart thread that panicked poisons the lock; the others stop
        // where they are and the panic reaches the caller at the join.
        self.board.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn waiting(&self) -> MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every thread ends at its next look, waiting ones at once.
    fn halt(&self) {
        self.stop.store(true, SeqCst);
        let _guard = self.waiting();
        self.wake.notify_all();
    }
}

/// Runs every hart on its own thread (hart 0 on the caller's) toward
/// instruction count `target`, until one of them sees a reason to stop:
/// the target reached, a request for the host or for power, or every hart
/// waiting for an interrupt. Returns the machine's instruction count then,
/// and the CPU time of the thread that spent the most (see
/// `Machine::run_cpu_time`). The slices a thread had begun are finished:
/// the count may pass the target by up to a slice a hart.
pub(crate) fn run(
    pool: &HartThreads,
    harts: &mut [Hart],
    ram: &GuestRam,
    board: &mut Board,
    clock: &VirtualClock,
    icount: u64,
    target: u64,
) -> (u64, Duration) {
    let (mut running, mut sleepers) = (Vec::new(), Vec::new());
    for (i, h) in harts.iter_mut().enumerate() {
        if h.is_idle() && !h.wake_pending() {
            sleepers.push((i, h.wake_condition()));
        } else {
            running.push((i, h));
        }
    }
    let shared = Shared {
        board: Mutex::new(board),
        sleepers,
        clock,
        ram,
        harts: running.len(),
        target,
        icount: AtomicU64::new(icount),
        time_floor: AtomicU64::new(clock.ticks_at(icount)),
        stop: AtomicBool::new(false),
        waiting: Mutex::new(Waiting { count: 0, until: u64::MAX }),
        wake: Condvar::new(),
        busiest: AtomicU64::new(0),
    };
    match running.split_first_mut() {
        None => {}
        Some(((i, h), [])) => hart_thread(&shared, *i, h),
        Some(((i, h), others)) => pool.in_place_scope(|scope| {
            for (j, other) in others.iter_mut() {
                let (shared, j) = (&shared, *j);
                scope.spawn(move |_| hart_thread(shared, j, other));
            }
            hart_thread(&shared, *i, h);
        }),
    }
    (shared.icount.load(SeqCst), Duration::from_nanos(shared.busiest.load(SeqCst)))
}

/// The host threads a machine's harts but the first run on (the first runs
/// on the caller's), kept from one run to the next: a run lasts a
/// fraction of a millisecond, and a thread made for each would cost more
/// than the run (62,838 of them in a 10-second job, measured). rayon's
/// pool keeps them, asleep between runs.
pub struct HartThreads(rayon::ThreadPool);

impl HartThreads {
    /// Threads for the harts of a machine of `harts` harts but its first.
    pub fn new(harts: usize) -> HartThreads {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(harts.saturating_sub(1).max(1))
            .thread_name(|i| format!("hart {}", i + 1))
            .build()
            .expect("threads for the harts");
        HartThreads(pool)
    }

    fn in_place_scope<'s, R>(&self, f: impl FnOnce(&rayon::Scope<'s>) -> R) -> R {
        self.0.in_place_scope(f)
    }
}

/// This thread's CPU time, in ns (CLOCK_THREAD_CPUTIME_ID).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the one we pass.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    debug_assert_eq!(r, 0, "every thread has a CPU-time clock");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One hart's thread: slices until a look says stop.
fn hart_thread(sh: &Shared, i: usize, h: &mut Hart) {
    let cpu = thread_cpu_ns();
    run_hart(sh, i, h);
    sh.busiest.fetch_max(thread_cpu_ns().saturating_sub(cpu), SeqCst);
}

fn run_hart(sh: &Shared, i: usize, h: &mut Hart) {
    let mut waiting = false;
    while !sh.stop.load(SeqCst) {
        let g = sh.icount.load(SeqCst);
        let timer = {
            let mut b = sh.board();
            let now = sh.clock.ticks_at(g);
            if g >= sh.target || b.power_request().is_some() || b.has_io_requests() || sh.a_sleeper_wakes(&mut b, now) {
                drop(b);
                sh.halt();
                break;
            }
            let mut lines = b.irq_bits(i, now);
            // Sstc: STIP while time >= stimecmp, as MTIP for mtimecmp.
            if h.stimecmp_deadline().is_some_and(|t| now >= t) {
                lines |= ftvm_cpu::csr::MIP_STIP;
            }
            h.set_irq_lines(lines);
            // The next timer that may concern this hart (the board's are
            // any hart's: a conservative look).
            let sstc = |h: &Hart| h.stimecmp_deadline().filter(|&t| t > now && t != u64::MAX);
            let sleepers = sh.sleepers.iter().filter_map(|(_, w)| w.stimecmp.filter(|&t| t > now && t != u64::MAX));
            [b.next_timer_deadline_after(now), sstc(h)].into_iter().flatten().chain(sleepers).min()
        };
        let timer_at = timer.and_then(|t| sh.clock.icount_reaching(t));
        if h.is_idle() && !h.wake_pending() {
            let mut w = sh.waiting();
            if !waiting {
                waiting = true;
                w.count += 1;
            }
            if let Some(at) = timer_at {
                w.until = w.until.min(at);
            }
            if w.count == sh.harts {
                // Every hart waits: the caller decides what now.
                drop(w);
                sh.halt();
                break;
            }
            // Woken by a hart that touched the board or passed a timer; the
            // timeout only bounds what a missed wake-up could cost.
            let _ = sh.wake.wait_timeout(w, Duration::from_millis(5));
            continue;
        }
        if waiting {
            waiting = false;
            sh.stop_waiting();
        }
        let mut budget = SLICE.min(sh.target.saturating_sub(g)).max(1);
        if let Some(at) = timer_at {
            budget = budget.min(at.saturating_sub(g).max(1));
        }
        let mut bus = SharedBus { shared: sh, slice_start: g, touched: false };
        let (steps, _) = h.run(sh.ram, &mut bus, budget);
        let after = sh.icount.fetch_add(steps, SeqCst) + steps;
        // A waiting hart may have been sent an interrupt (a device or
        // another hart's IPI) or reached its timer.
        // One look under the lock: whether anyone waits, and until when.
        let w = sh.waiting();
        if w.count > 0 && (bus.touched || after >= w.until) {
            sh.wake.notify_all();
        }
    }
    if waiting {
        sh.stop_waiting();
    }
}

impl Shared<'_> {
    /// Whether a hart that sits this run out would wake at time `now`
    /// (an interrupt another hart or a device raised, or its timer).
    fn a_sleeper_wakes(&self, board: &mut Board, now: u64) -> bool {
        self.sleepers.iter().any(|&(j, w)| w.wakes(board.irq_bits(j, now), now))
    }

    /// A hart waits no longer.
    fn stop_waiting(&self) {
        let mut w = self.waiting();
        w.count -= 1;
        if w.count == 0 {
            w.until = u64::MAX;
        }
    }
}

/// The bus of a hart beside others: each device access locks the board.
struct SharedBus<'s, 'a> {
    shared: &'s Shared<'a>,
    slice_start: u64,
    /// Whether the slice reached the board (anything there may concern
    /// another hart: an IPI, an interrupt claimed or raised).
    touched: bool,
}

impl SharedBus<'_, '_> {
    fn with<R>(&mut self, f: impl FnOnce(&mut HartBus) -> R) -> R {
        self.touched = true;
        let sh = self.shared;
        let mut board = sh.board();
        let mut bus = HartBus::new(&mut board, sh.clock, self.slice_start).time_floor(&sh.time_floor);
        f(&mut bus)
    }
}

impl Bus for SharedBus<'_, '_> {
    fn read(&mut self, ram: &GuestRam, paddr: u64, size: u8, progress: u64) -> Option<u64> {
        self.with(|bus| bus.read(ram, paddr, size, progress))
    }

    fn write(&mut self, ram: &GuestRam, paddr: u64, size: u8, value: u64, progress: u64) -> bool {
        self.with(|bus| bus.write(ram, paddr, size, value, progress))
    }

    fn time(&mut self, progress: u64) -> u64 {
        let sh = self.shared;
        time_at_least(&sh.time_floor, sh.clock.ticks_at(self.slice_start + progress))
    }
}
