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
//! No hart runs more than [`LEAD`] of host CPU time ahead of another that
//! runs: one that is waits until the other catches up. Guest time follows
//! the machine's instruction count, whichever hart retires them, so a
//! hart whose thread the host did not run (woken after the caller's, or
//! starved of a core on a loaded host) fell ever further behind in guest
//! time while the others ran its runs for it: a second hart ran nothing
//! for a second of guest time on a loaded host, and Linux gave up on it
//! ("CPU1: failed to come online"). CPU time, not instructions, because a
//! hart may be slower than another for want of translated code alone, and
//! that costs the other nothing. A hart that waits for an interrupt is
//! not behind: it counts from the others' lead when it wakes.
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

/// How much host CPU time a hart may spend ahead of another that runs:
/// several of a loaded host's scheduling slices, so that a hart whose
/// thread has a core runs on while another's waits for one, and a small
/// part of any timeout a guest sets (Linux waits a second for a hart it
/// starts).
pub const LEAD: Duration = Duration::from_millis(10);

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
    /// The harts waiting for an interrupt (guarded), woken through `wake`,
    /// which also wakes harts waiting for another to catch up.
    waiting: Mutex<Waiting>,
    wake: Condvar,
    /// The host CPU time each hart (by index) spent in runs, in ns, its
    /// lead made up while it waited for an interrupt (see [`LEAD`]).
    cpu: Vec<AtomicU64>,
    /// Whether each hart (by index) counts in the others' lead: it runs in
    /// this run, and neither waits for an interrupt nor has left.
    pacing: Vec<AtomicBool>,
    /// The most CPU time one of the threads spent, in ns.
    busiest: AtomicU64,
}

struct Waiting {
    count: usize,
    /// The harts waiting for another to catch up (see [`LEAD`]).
    ahead: usize,
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

/// Runs every hart on its own thread (hart 0 on the caller's, each at most
/// [`LEAD`] ahead of another) toward
/// instruction count `target`, until one of them sees a reason to stop:
/// the target reached, a request for the host or for power, or every hart
/// waiting for an interrupt. Returns the machine's instruction count then,
/// and the CPU time of the thread that spent the most (see
/// `Machine::run_cpu_time`). The slices a thread had begun are finished:
/// the count may pass the target by up to a slice a hart.
pub(crate) fn run(
    pool: &mut HartThreads,
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
    // A hart that sleeps is behind no one.
    let top = pool.cpu.iter().copied().max().unwrap_or(0);
    for &(j, _) in &sleepers {
        pool.cpu[j] = top;
    }
    let pacing = (0..pool.cpu.len()).map(|j| AtomicBool::new(running.iter().any(|&(i, _)| i == j))).collect();
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
        waiting: Mutex::new(Waiting { count: 0, ahead: 0, until: u64::MAX }),
        wake: Condvar::new(),
        cpu: pool.cpu.iter().map(|&c| AtomicU64::new(c)).collect(),
        pacing,
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
    for (c, s) in pool.cpu.iter_mut().zip(&shared.cpu) {
        *c = s.load(SeqCst);
    }
    (shared.icount.load(SeqCst), Duration::from_nanos(shared.busiest.load(SeqCst)))
}

/// The host threads a machine's harts but the first run on (the first runs
/// on the caller's), kept from one run to the next: a run lasts a
/// fraction of a millisecond, and a thread made for each would cost more
/// than the run (62,838 of them in a 10-second job, measured). rayon's
/// pool keeps them, asleep between runs.
/// With them, the CPU time each hart has spent in runs (see [`LEAD`]).
pub struct HartThreads {
    pool: rayon::ThreadPool,
    cpu: Vec<u64>,
}

impl HartThreads {
    /// Threads for the harts of a machine of `harts` harts but its first.
    pub fn new(harts: usize) -> HartThreads {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(harts.saturating_sub(1).max(1))
            .thread_name(|i| format!("hart {}", i + 1))
            .build()
            .expect("threads for the harts");
        HartThreads { pool, cpu: vec![0; harts] }
    }

    fn in_place_scope<'s, R>(&self, f: impl FnOnce(&rayon::Scope<'s>) -> R) -> R {
        self.pool.in_place_scope(f)
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
    let mut cpu = thread_cpu_ns();
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
                // No one waits for this hart to catch up now.
                sh.pacing[i].store(false, SeqCst);
                sh.wake.notify_all();
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
            cpu = thread_cpu_ns();
            continue;
        }
        if waiting {
            waiting = false;
            sh.stop_waiting(i);
        }
        if sh.ahead(i) {
            // Until the hart behind runs, waits or leaves, or the run ends.
            let mut w = sh.waiting();
            if sh.ahead(i) && !sh.stop.load(SeqCst) {
                w.ahead += 1;
                // The timeout only bounds what a missed wake-up could cost.
                let (mut w, _) = sh.wake.wait_timeout(w, Duration::from_millis(1)).unwrap_or_else(|e| e.into_inner());
                w.ahead -= 1;
            }
            cpu = thread_cpu_ns();
            continue;
        }
        let mut budget = SLICE.min(sh.target.saturating_sub(g)).max(1);
        if let Some(at) = timer_at {
            budget = budget.min(at.saturating_sub(g).max(1));
        }
        let mut bus = SharedBus { shared: sh, slice_start: g, touched: false };
        let (steps, _) = h.run(sh.ram, &mut bus, budget);
        let after = sh.icount.fetch_add(steps, SeqCst) + steps;
        let now = thread_cpu_ns();
        sh.cpu[i].fetch_add(now.saturating_sub(cpu), SeqCst);
        cpu = now;
        // A waiting hart may have been sent an interrupt (a device or
        // another hart's IPI) or reached its timer, and one ahead may wait
        // for this one. One look under the lock: whether anyone waits, and
        // until when.
        let w = sh.waiting();
        if w.ahead > 0 || (w.count > 0 && (bus.touched || after >= w.until)) {
            sh.wake.notify_all();
        }
    }
    if waiting {
        sh.stop_waiting(i);
    }
    // Those ahead of this hart need wait no more.
    sh.pacing[i].store(false, SeqCst);
    let _guard = sh.waiting();
    sh.wake.notify_all();
}

impl Shared<'_> {
    /// Whether a hart that sits this run out would wake at time `now`
    /// (an interrupt another hart or a device raised, or its timer).
    fn a_sleeper_wakes(&self, board: &mut Board, now: u64) -> bool {
        self.sleepers.iter().any(|&(j, w)| w.wakes(board.irq_bits(j, now), now))
    }

    /// Hart `i` waits for an interrupt no longer: it runs on from the lead
    /// of the others, as if it had kept up with them.
    fn stop_waiting(&self, i: usize) {
        let mut w = self.waiting();
        w.count -= 1;
        if w.count == 0 {
            w.until = u64::MAX;
        }
        let top = self.cpu.iter().map(|c| c.load(SeqCst)).max().unwrap_or(0);
        self.cpu[i].fetch_max(top, SeqCst);
        self.pacing[i].store(true, SeqCst);
    }

    /// Whether hart `i` is [`LEAD`] ahead of another that runs.
    fn ahead(&self, i: usize) -> bool {
        let mine = self.cpu[i].load(SeqCst);
        let lead = LEAD.as_nanos() as u64;
        (0..self.cpu.len()).any(|j| j != i && self.pacing[j].load(SeqCst) && self.cpu[j].load(SeqCst) + lead <= mine)
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
