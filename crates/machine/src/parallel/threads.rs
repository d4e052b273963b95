//! The host threads that run a machine's harts beside the caller's (see
//! [`super::run`]), kept from one run to the next, and how a thread joins
//! and leaves a run.
//!
//! Our own threads rather than a pool's scope (rayon's, used before):
//! a scope ends only when every job spawned in it has run, so each run
//! (a millisecond of guest work) ended by waiting for a thread the host
//! had not yet given a core, to see "stop" and return. On a loaded host
//! that wait was most of the time (a job took 176 s against 40.7 s on
//! the caller's thread alone). Here a run is open to the threads while it
//! lasts, and closing it waits only for those inside it: a thread the host
//! runs late finds the run over, and waits for the next one; its harts
//! ran on the threads that were there (see [`super::Shared::turn`]).

use super::{Pause, Shared};
use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// The host threads a machine's harts run on beside the caller's, and the
/// host CPU time each hart has spent in runs (see [`super::LEAD`]).
pub struct HartThreads {
    crew: Arc<Crew>,
    threads: Vec<JoinHandle<()>>,
    pub(super) cpu: Vec<u64>,
}

/// What the threads share with the caller, from one run to the next.
pub(super) struct Crew {
    state: Mutex<CrewState>,
    /// Wakes the threads waiting for a run: one opened, or shutdown.
    start: Condvar,
    /// Wakes the threads waiting in a run (the caller's too): a hart may
    /// have something to run (one fell behind, an interrupt), the run
    /// stopped, or another opened.
    wake: Condvar,
    /// Wakes the caller closing a run when the last thread leaves it.
    left: Condvar,
    /// Threads waiting for a turn: for a hart that is ahead to fall behind
    /// (they are woken after every slice).
    pub(super) waiting_for_turn: AtomicUsize,
    /// Threads waiting for a hart's interrupt (woken when a slice touched
    /// the board or passed a timer).
    pub(super) waiting_for_interrupt: AtomicUsize,
}

struct CrewState {
    /// The open run, if any.
    run: Option<RunRef>,
    /// Counts the runs opened.
    generation: u64,
    /// How many more threads may join the open run (one for each hart that
    /// runs, the caller's included).
    seats: usize,
    /// The threads inside the open run: reading its [`Shared`].
    inside: usize,
    /// What a thread's panic in the run carried, for the caller.
    panic: Option<Box<dyn Any + Send>>,
    shutdown: bool,
    /// Tests hold the threads to stand for a host that does not run them.
    #[cfg(test)]
    held: bool,
}

/// The open run's [`Shared`], its lifetime erased: it lives on the stack of
/// the caller of [`super::run`], which closes the run and waits for every
/// thread inside to leave before it returns (or unwinds).
#[derive(Clone, Copy)]
struct RunRef(*const Shared<'static>);

// SAFETY: a `Shared` is Sync (the threads share it by reference); the
// pointer is dereferenced only between joining and leaving the run, while
// the caller keeps it alive (see `HartThreads::close`).
unsafe impl Send for RunRef {}

impl Crew {
    fn state(&self) -> MutexGuard<'_, CrewState> {
        // Panics inside a run are caught (never with this lock held).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes every thread waiting in a run. Under the lock the waiters
    /// count themselves under (see `wait`): none is missed, and none is
    /// woken, nor a system call made, when none waits (at every run's end).
    pub(super) fn wake_all(&self) {
        let _guard = self.state();
        if self.waiting_for_turn.load(SeqCst) + self.waiting_for_interrupt.load(SeqCst) > 0 {
            self.wake.notify_all();
        }
    }

    /// Waits in a run until woken or `timeout` passes, counted as waiting
    /// for a turn (`for_turn`) or for an interrupt.
    fn wait<'g>(
        &self,
        guard: MutexGuard<'g, CrewState>,
        timeout: Duration,
        for_turn: bool,
    ) -> MutexGuard<'g, CrewState> {
        let count = if for_turn { &self.waiting_for_turn } else { &self.waiting_for_interrupt };
        count.fetch_add(1, SeqCst);
        let (guard, _) = self.wake.wait_timeout(guard, timeout).unwrap_or_else(|e| e.into_inner());
        count.fetch_sub(1, SeqCst);
        guard
    }
}

impl HartThreads {
    /// Threads for the harts of a machine of `harts` harts but one (the
    /// caller's thread is the last).
    pub fn new(harts: usize) -> HartThreads {
        let crew = Arc::new(Crew {
            state: Mutex::new(CrewState {
                run: None,
                generation: 0,
                seats: 0,
                inside: 0,
                panic: None,
                shutdown: false,
                #[cfg(test)]
                held: false,
            }),
            start: Condvar::new(),
            wake: Condvar::new(),
            left: Condvar::new(),
            waiting_for_turn: AtomicUsize::new(0),
            waiting_for_interrupt: AtomicUsize::new(0),
        });
        let threads = (1..harts.max(2))
            .map(|i| {
                let crew = crew.clone();
                std::thread::Builder::new()
                    .name(format!("harts {i}"))
                    .spawn(move || serve(&crew))
                    .expect("a thread for the harts")
            })
            .collect();
        HartThreads { crew, threads, cpu: vec![0; harts] }
    }

    pub(super) fn crew(&self) -> &Crew {
        &self.crew
    }

    /// Opens a run to `seats` threads and wakes them.
    pub(super) fn open(&self, run: &Shared, seats: usize) {
        let mut st = self.crew.state();
        st.run = Some(RunRef(std::ptr::from_ref(run).cast()));
        st.generation += 1;
        st.seats = seats;
        self.crew.start.notify_all();
        // Threads that waited in the last run wait for this one too.
        self.crew.wake.notify_all();
    }

    /// Waits, for the caller's thread, as a thread of the crew would,
    /// unless the run stopped (`stop`: looked at under the lock, so that
    /// the wake-up of the stop is not missed).
    pub(super) fn wait(&self, timeout: Duration, for_turn: bool, stop: &AtomicBool) {
        let st = self.crew.state();
        if !stop.load(SeqCst) {
            drop(self.crew.wait(st, timeout, for_turn));
        }
    }

    /// Closes the open run (if any): no thread joins it any more, and those
    /// inside (finishing a slice, seeing the stop) have left when this
    /// returns. A panic on one of them goes on on the caller's.
    pub(super) fn close(&self) {
        let mut st = self.crew.state();
        st.run = None;
        while st.inside > 0 {
            st = self.crew.left.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if let Some(payload) = st.panic.take() {
            drop(st);
            resume_unwind(payload);
        }
    }

    /// Holds the threads out of every run (`true`) or lets them in again.
    #[cfg(test)]
    pub(super) fn hold(&self, held: bool) {
        self.crew.state().held = held;
    }
}

impl Drop for HartThreads {
    fn drop(&mut self) {
        self.crew.state().shutdown = true;
        self.crew.start.notify_all();
        self.crew.wake.notify_all();
        for t in self.threads.drain(..) {
            // A thread's panics are caught in the run; nothing else panics.
            let _ = t.join();
        }
    }
}

/// A thread of the crew: joins each run it finds open (while there is a
/// seat), runs turns until the run stops, and waits between.
fn serve(crew: &Crew) {
    // The run this thread has a seat in (its generation and the seat),
    // and the last run it is done with (stopped, or no seat left).
    let mut seat: Option<(u64, usize)> = None;
    let mut done = 0;
    let mut st = crew.state();
    loop {
        if st.shutdown {
            return;
        }
        let generation = st.generation;
        #[cfg(test)]
        let held = st.held;
        #[cfg(not(test))]
        let held = false;
        let run = match st.run {
            Some(run) if generation != done && !held => run,
            _ => {
                st = crew.start.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
        };
        let s = match seat {
            Some((g, s)) if g == generation => s,
            _ if st.seats > 0 => {
                st.seats -= 1;
                // Seat 0 is the caller's.
                let s = st.seats + 1;
                seat = Some((generation, s));
                s
            }
            _ => {
                done = generation;
                continue;
            }
        };
        st.inside += 1;
        drop(st);
        // SAFETY: the run is open and this thread counted inside it: the
        // caller does not return before it has left (`HartThreads::close`).
        let sh = unsafe { &*run.0 };
        let turn = catch_unwind(AssertUnwindSafe(|| sh.turns(s)));
        if turn.is_err() {
            sh.halt();
        }
        st = crew.state();
        st.inside -= 1;
        if st.inside == 0 && st.run.is_none() {
            crew.left.notify_all();
        }
        match turn {
            Err(payload) => {
                st.panic.get_or_insert(payload);
                done = generation;
            }
            Ok(Pause::Stop) => done = generation,
            Ok(Pause::Wait { timeout, for_turn }) => st = crew.wait(st, timeout, for_turn),
        }
    }
}
