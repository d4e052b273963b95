//! Harts on their own host threads: how a machine runs when nothing needs
//! its run to be repeatable (a plain VM, a checkpointed primary; see
//! [`crate::Machine::set_parallel`]), as QEMU's MTTCG does.
//!
//! Each hart runs slices of at most [`SLICE`] steps, looking at the board
//! between them (its interrupt lines, requests for the host, power, the
//! target) with the board locked; an access to a device locks it too. RAM
//! is shared (see `ftvm_memory`): AMOs, SC and the page walker's A/D bits
//! use the host's atomics, and a page that becomes code waits for the
//! other harts' store TLBs (`Tlb::purge_and_wait`). The instruction count
//! is the sum of what the harts retired, and guest time follows it, never
//! going back from one hart's read to another's (`HartBus::time_floor`).
//!
//! A hart is run by whichever thread holds it: each thread (the caller's
//! and one of [`HartThreads`] for each other hart that runs) has a hart of
//! its own that it runs when it can, and when it cannot (that hart is
//! ahead, or waits for an interrupt) it runs a hart no thread holds. So a
//! hart whose thread the host has not run yet still runs, on the caller's
//! thread, and a run never waits for a thread to come (see `threads`).
//!
//! A hart waiting for an interrupt with none pending when a run begins
//! sits it out (no thread is woken for it), watched at every look of the
//! others: the run ends when it would wake, and the next one runs it. So a
//! guest with one busy hart runs it on the caller's thread alone, as one
//! thread would.
//!
//! No hart runs more than [`LEAD`] of host CPU time ahead of another that
//! runs. Guest time follows the machine's instruction count, whichever
//! hart retires them, so a hart that the host did not run (its thread woken
//! after the caller's, or starved of a core on a loaded host) fell ever
//! further behind in guest time while the others ran on: a second hart ran
//! nothing for a second of guest time on a loaded host, and Linux gave up
//! on it ("CPU1: failed to come online"). CPU time, not instructions,
//! because a hart may be slower than another for want of translated code
//! alone, and that costs the other nothing. A hart that waits for an
//! interrupt is not behind: it counts from the others' lead when it wakes.
//!
//! Every decision to stop is taken again by the caller with all harts
//! stopped (`Machine::run_until`): the threads only say when to look.

mod threads;

pub use threads::HartThreads;

use crate::board::{time_at_least, Board, HartBus};
use crate::clock::VirtualClock;
use ftvm_cpu::{Bus, Hart, WakeCondition};
use ftvm_memory::GuestRam;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::Duration;
use threads::Crew;

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

/// How long a thread with nothing to run waits before it looks again, if
/// no one wakes it: for a hart that is ahead to fall behind; for an
/// interrupt. They only bound what a missed wake-up could cost.
const WAIT_FOR_TURN: Duration = Duration::from_millis(1);
const WAIT_FOR_INTERRUPT: Duration = Duration::from_millis(5);

/// What the threads share during one [`run`]: by reference, from the
/// caller's stack (see `threads::RunRef`), so it must be Sync.
struct Shared<'a> {
    crew: &'a Crew,
    board: Mutex<&'a mut Board>,
    /// The harts that run, each run by the thread that holds it.
    slots: Vec<Mutex<Slot<'a>>>,
    /// The harts that sit this run out, by index, and what wakes each.
    sleepers: Vec<(usize, WakeCondition)>,
    clock: &'a VirtualClock,
    ram: &'a GuestRam,
    target: u64,
    /// The machine's instruction count: every hart's steps added.
    icount: AtomicU64,
    /// The latest time a hart read (see `HartBus::time_floor`).
    time_floor: AtomicU64,
    /// Set when a thread saw a reason to stop: every thread ends at its
    /// next look.
    stop: AtomicBool,
    /// The harts waiting for an interrupt.
    waiting: Mutex<Waiting>,
    /// The host CPU time each hart (by index) spent in runs, in ns, its
    /// lead made up while it waited for an interrupt (see [`LEAD`]).
    cpu: Vec<AtomicU64>,
    /// Whether each hart (by index) counts in the others' lead: it runs in
    /// this run, and does not wait for an interrupt.
    pacing: Vec<AtomicBool>,
    /// The CPU time each thread spent in this run, by seat (0: the
    /// caller's), in ns.
    spent: Vec<AtomicU64>,
    /// Whether the thread in each seat is running turns (not waiting, not
    /// yet come, not gone): then the hart of its seat (the slot of the same
    /// index) is its own to run.
    present: Vec<AtomicBool>,
}

const _: () = {
    const fn sync<T: Sync>() {}
    sync::<Shared<'static>>()
};

/// A hart that runs in this run.
struct Slot<'a> {
    /// Its index in the machine.
    index: usize,
    hart: &'a mut Hart,
    /// Whether it waits for an interrupt (counted in `Waiting::count`).
    waiting: bool,
}

struct Waiting {
    count: usize,
    /// The earliest instruction count at which a timer may wake one of
    /// them (u64::MAX: none).
    until: u64,
}

/// What one thread's turn came to.
enum Turn {
    /// It ran a slice of a hart.
    Ran,
    Pause(Pause),
}

/// Why a thread stops running turns.
enum Pause {
    /// The run stops.
    Stop,
    /// Nothing to run now: every hart is ahead, held by another thread, or
    /// waits for an interrupt; `for_turn`: one was ahead (a slice of another
    /// may change that).
    Wait { timeout: Duration, for_turn: bool },
}

impl<'a> Shared<'a> {
    fn board(&self) -> MutexGuard<'_, &'a mut Board> {
        // A hart thread that panicked poisons the lock; the others stop
        // where they are and the panic reaches the caller.
        self.board.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn waiting(&self) -> MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every thread ends at its next look, those waiting in the run woken.
    fn halt(&self) {
        self.stop.store(true, SeqCst);
        self.crew.wake_all();
    }
}

/// Runs the harts on the caller's thread and those of `pool` (each at most
/// [`LEAD`] ahead of another) toward instruction count `target`, until one
/// of them sees a reason to stop: the target reached, a request for the
/// host or for power, or every hart waiting for an interrupt. Returns the
/// machine's instruction count then, and the CPU time of the thread that
/// spent the most (see `Machine::run_cpu_time`). The slices a thread had
/// begun are finished: the count may pass the target by up to a slice a
/// hart.
pub(crate) fn run(
    pool: &mut HartThreads,
    harts: &mut [Hart],
    ram: &GuestRam,
    board: &mut Board,
    clock: &VirtualClock,
    icount: u64,
    target: u64,
) -> (u64, Duration) {
    let (mut slots, mut sleepers) = (Vec::new(), Vec::new());
    for (index, hart) in harts.iter_mut().enumerate() {
        if hart.is_idle() && !hart.wake_pending() {
            sleepers.push((index, hart.wake_condition()));
        } else {
            slots.push(Mutex::new(Slot { index, hart, waiting: false }));
        }
    }
    if slots.is_empty() {
        // Not one to run (`Machine::run_until` does not ask then).
        return (icount, Duration::ZERO);
    }
    // A hart that sleeps is behind no one.
    let top = pool.cpu.iter().copied().max().unwrap_or(0);
    for &(j, _) in &sleepers {
        pool.cpu[j] = top;
    }
    let pacing = (0..pool.cpu.len()).map(|j| AtomicBool::new(!sleepers.iter().any(|&(i, _)| i == j))).collect();
    let seats = slots.len();
    let shared = Shared {
        crew: pool.crew(),
        board: Mutex::new(board),
        slots,
        sleepers,
        clock,
        ram,
        target,
        icount: AtomicU64::new(icount),
        time_floor: AtomicU64::new(clock.ticks_at(icount)),
        stop: AtomicBool::new(false),
        waiting: Mutex::new(Waiting { count: 0, until: u64::MAX }),
        cpu: pool.cpu.iter().map(|&c| AtomicU64::new(c)).collect(),
        pacing,
        spent: (0..seats).map(|_| AtomicU64::new(0)).collect(),
        present: (0..seats).map(|_| AtomicBool::new(false)).collect(),
    };
    if seats > 1 {
        pool.open(&shared, seats - 1);
    }
    let ran = catch_unwind(AssertUnwindSafe(|| loop {
        match shared.turns(0) {
            Pause::Stop => break,
            Pause::Wait { timeout, for_turn } => pool.wait(timeout, for_turn, &shared.stop),
        }
    }));
    if ran.is_err() {
        shared.halt();
    }
    // Before `shared` goes: no thread reads it once this returns.
    pool.close();
    if let Err(payload) = ran {
        resume_unwind(payload);
    }
    let busiest = shared.spent.iter().map(|s| s.load(SeqCst)).max().unwrap_or(0);
    let mut cpu: Vec<u64> = shared.cpu.iter().map(|c| c.load(SeqCst)).collect();
    // A hart that waits for an interrupt is behind no one (as if it had
    // woken now).
    let top = cpu.iter().copied().max().unwrap_or(0);
    for slot in &shared.slots {
        let slot = slot.lock().unwrap_or_else(|e| e.into_inner());
        if slot.waiting {
            cpu[slot.index] = top;
        }
    }
    let icount = shared.icount.load(SeqCst);
    drop(shared);
    pool.cpu = cpu;
    (icount, Duration::from_nanos(busiest))
}

/// This thread's CPU time, in ns (CLOCK_THREAD_CPUTIME_ID).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the one we pass.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    debug_assert_eq!(r, 0, "every thread has a CPU-time clock");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Shared<'_> {
    /// The turns of the thread in `seat` until it must wait or the run
    /// stops; its CPU time added to its seat's.
    fn turns(&self, seat: usize) -> Pause {
        let start = thread_cpu_ns();
        let mut mark = start;
        self.present[seat].store(true, SeqCst);
        let pause = loop {
            if let Turn::Pause(pause) = self.turn(seat, &mut mark) {
                break pause;
            }
        };
        self.present[seat].store(false, SeqCst);
        self.spent[seat].fetch_add(thread_cpu_ns().saturating_sub(start), SeqCst);
        pause
    }

    /// One slice of a hart: the thread's own (the one its seat names)
    /// if it can run, else the next that can whose own thread is away
    /// (waiting, not come yet, or gone) and that no other thread holds.
    /// `mark`: the thread's CPU time when it last charged a hart for it.
    fn turn(&self, seat: usize, mark: &mut u64) -> Turn {
        let n = self.slots.len();
        let mut for_turn = false;
        for k in (0..n).map(|d| (seat + d) % n) {
            if self.stop.load(SeqCst) {
                return Turn::Pause(Pause::Stop);
            }
            // Another thread's hart is that thread's to run while it is in
            // the run: a hart moved from thread to thread between slices
            // runs slower (its state moves between the host's caches).
            if k != seat && self.present[k].load(SeqCst) {
                continue;
            }
            let mut slot = match self.slots[k].try_lock() {
                Ok(slot) => slot,
                // This thread's own hart, run by another while this one was
                // away: that one lets it go after its slice, seeing this
                // one back.
                Err(TryLockError::WouldBlock) if k == seat => loop {
                    std::thread::yield_now();
                    if self.stop.load(SeqCst) {
                        return Turn::Pause(Pause::Stop);
                    }
                    if let Ok(slot) = self.slots[k].try_lock() {
                        break slot;
                    }
                },
                // Another's (it lets it go when the hart is ahead or waits),
                // or a thread panicked holding it (the run stops).
                Err(_) => continue,
            };
            match self.step(&mut slot, mark) {
                Step::Ran => return Turn::Ran,
                Step::Stop => return Turn::Pause(Pause::Stop),
                Step::Ahead => for_turn = true,
                Step::Waiting => {}
            }
        }
        let timeout = if for_turn { WAIT_FOR_TURN } else { WAIT_FOR_INTERRUPT };
        Turn::Pause(Pause::Wait { timeout, for_turn })
    }

    /// A look at the board for the hart in `slot` and, if it can run, a
    /// slice of it.
    fn step(&self, slot: &mut Slot, mark: &mut u64) -> Step {
        let i = slot.index;
        // Before the look: a hart that is ahead does not run, whatever it
        // would see (the others' looks take the reasons to stop).
        if !slot.waiting && self.ahead(i) {
            return Step::Ahead;
        }
        let h = &mut *slot.hart;
        let g = self.icount.load(SeqCst);
        let timer = {
            let mut b = self.board();
            let now = self.clock.ticks_at(g);
            if g >= self.target
                || b.power_request().is_some()
                || b.has_io_requests()
                || self.a_sleeper_wakes(&mut b, now)
            {
                drop(b);
                self.halt();
                return Step::Stop;
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
            let sleepers = self.sleepers.iter().filter_map(|(_, w)| w.stimecmp.filter(|&t| t > now && t != u64::MAX));
            [b.next_timer_deadline_after(now), sstc(h)].into_iter().flatten().chain(sleepers).min()
        };
        let timer_at = timer.and_then(|t| self.clock.icount_reaching(t));
        if h.is_idle() && !h.wake_pending() {
            let mut w = self.waiting();
            if !slot.waiting {
                slot.waiting = true;
                w.count += 1;
                // No one waits for this hart to catch up now.
                self.pacing[i].store(false, SeqCst);
                self.crew.wake_all();
            }
            if let Some(at) = timer_at {
                w.until = w.until.min(at);
            }
            if w.count == self.slots.len() {
                // Every hart waits: the caller decides what now.
                drop(w);
                self.halt();
                return Step::Stop;
            }
            return Step::Waiting;
        }
        if slot.waiting {
            slot.waiting = false;
            self.stop_waiting(i);
            if self.ahead(i) {
                return Step::Ahead;
            }
        }
        let mut budget = SLICE.min(self.target.saturating_sub(g)).max(1);
        if let Some(at) = timer_at {
            budget = budget.min(at.saturating_sub(g).max(1));
        }
        let mut bus = SharedBus { shared: self, slice_start: g, touched: false };
        let (steps, _) = h.run(self.ram, &mut bus, budget);
        let after = self.icount.fetch_add(steps, SeqCst) + steps;
        let now = thread_cpu_ns();
        self.cpu[i].fetch_add(now.saturating_sub(*mark), SeqCst);
        *mark = now;
        // A thread may wait for a turn (this hart let go, or one ahead that
        // may not be now), or for an interrupt (a device's or another
        // hart's IPI, or a timer reached).
        let for_turn = self.crew.waiting_for_turn.load(SeqCst) > 0;
        let for_interrupt = self.crew.waiting_for_interrupt.load(SeqCst) > 0 && {
            let w = self.waiting();
            w.count > 0 && (bus.touched || after >= w.until)
        };
        if for_turn || for_interrupt {
            self.crew.wake_all();
        }
        Step::Ran
    }

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

/// What a look at one hart came to.
enum Step {
    /// It ran a slice.
    Ran,
    /// The run stops (this look saw why).
    Stop,
    /// It is [`LEAD`] ahead of another that runs.
    Ahead,
    /// It waits for an interrupt.
    Waiting,
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

#[cfg(test)]
mod tests {
    use crate::{Machine, MachineConfig};
    use std::time::Duration;

    /// Harts whose threads the host does not run at all (held here) still
    /// run, on the caller's thread, each in its turn, and no run waits for
    /// those threads. Before, every run ended by waiting for each thread to
    /// come: on a loaded host that wait was most of a run's time.
    #[test]
    fn harts_run_while_their_threads_do_not() {
        // addi t1, t1, 1; j -4
        let code = [0x0013_0313u32, 0xffdf_f06f];
        let mut cfg = MachineConfig::bare_metal(code.iter().flat_map(|w| w.to_le_bytes()).collect(), 32 << 20);
        cfg.harts = 2;
        let mut m = Machine::new(&cfg).unwrap();
        m.set_parallel(true);
        m.hart_threads().expect("threads for the harts").hold(true);
        // On a thread of its own: a run that waits for the held thread
        // fails the test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Short runs, as a host loop near its pacing bound makes them;
            // in all far more host time than the lead a hart may take.
            while m.icount() < 1_000_000_000 {
                m.run_until(m.icount() + 20_000);
            }
            tx.send(m.harts().iter().map(|h| h.s.x[6]).collect::<Vec<u64>>()).unwrap();
        });
        let counts = rx.recv_timeout(Duration::from_secs(300)).expect("the runs end without the held threads");
        let total: u64 = counts.iter().sum();
        for (i, &c) in counts.iter().enumerate() {
            assert!(c * 100 >= total * 35, "hart {i} ran {c} of {total} rounds: {counts:?}");
        }
    }
}
