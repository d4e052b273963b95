//! The threads that watch the peer (heartbeats out and in, failure
//! detection, the primary's reader of acknowledgements) run at a priority
//! the VM's own threads cannot starve.
//!
//! On a loaded host a side's threads can wait for a CPU for hundreds of
//! milliseconds: the VM thread and everything else runnable share the
//! cores. A heartbeat that is not sent in time, or a detector that looks
//! late, turns that wait into a false failover (issue 27 measured 9 in
//! about 100 healthy pairs at the default 500 ms timeout). These threads
//! sleep almost all the time and do microseconds of work when they wake,
//! so giving them a real-time class costs the VM nothing: they take the
//! CPU only for that work. Round-robin at a low real-time priority
//! (below the kernel's own real-time threads), so that even a watcher
//! gone wrong shares with its peers and is bounded by the kernel's
//! real-time throttling. Where real-time scheduling is not allowed (no
//! CAP_SYS_NICE, or a cgroup without real-time runtime), the thread's
//! nice value is lowered instead; failing that, it runs as it is (said
//! once per process).

use std::sync::Once;

/// The real-time priority of a watcher thread (1 is lowest, 99 highest;
/// the kernel's own threads sit at 50 and above).
const RT_PRIORITY: i32 = 6;
/// The real-time priority of the log's sender and receiver, below the
/// watchers: they move the log, sealing and opening it as they go, which
/// for a checkpoint of tens of MB is tens of milliseconds of work at a
/// time. At the watchers' own priority, round-robin would let a heartbeat
/// that became due wait behind them for a whole time slice (100 ms):
/// issue 65 saw a beat 91 ms late right after a protect, with both sides
/// moving the first checkpoints on a 2-core host.
const RT_MOVER_PRIORITY: i32 = 5;
/// The nice value of a watcher where real-time scheduling is refused.
const NICE: i32 = -15;

/// What a thread's priority became.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// SCHED_RR at [`RT_PRIORITY`].
    RealTime,
    /// The normal class, nice [`NICE`].
    Raised,
    /// As it was: neither could be set.
    Unchanged,
}

/// Raises the calling thread to a watcher's priority: the heartbeat,
/// the detectors, the acknowledgements' reader (microseconds of work when
/// they wake).
pub fn raise_watcher() -> Priority {
    raise(RT_PRIORITY)
}

/// Raises the calling thread to the priority of the log's sender and
/// receiver: above the VM's threads, below the watchers.
pub fn raise_mover() -> Priority {
    raise(RT_MOVER_PRIORITY)
}

fn raise(priority: i32) -> Priority {
    let param = libc::sched_param { sched_priority: priority };
    // SAFETY: pid 0 is the calling thread; param is valid for the call.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_RR, &param) } == 0 {
        return Priority::RealTime;
    }
    let rt_error = std::io::Error::last_os_error();
    // SAFETY: gettid takes nothing and cannot fail.
    let tid = unsafe { libc::gettid() };
    // SAFETY: setpriority takes no pointers; on Linux PRIO_PROCESS with a
    // thread id sets that thread's nice value alone.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, NICE) } == 0 {
        return Priority::Raised;
    }
    static SAID: Once = Once::new();
    SAID.call_once(|| {
        eprintln!(
            "ftvm: the pair's watcher threads run at normal priority (real-time: {rt_error}; nice: {}): \
             a loaded host may delay its heartbeats",
            std::io::Error::last_os_error()
        );
    });
    Priority::Unchanged
}

/// The calling thread's scheduling policy.
#[cfg(test)]
fn policy() -> i32 {
    // SAFETY: pid 0 is the calling thread.
    unsafe { libc::sched_getscheduler(0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watcher_is_raised_and_other_threads_are_not() {
        let (got, policy_after) = std::thread::spawn(|| (raise_watcher(), policy())).join().unwrap();
        // SAFETY: geteuid takes nothing and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            // Root may always lower a nice value, if not take a real-time class.
            assert_ne!(got, Priority::Unchanged);
        }
        if got == Priority::RealTime {
            assert_eq!(policy_after, libc::SCHED_RR);
        }
        // Only the thread that asked.
        assert_eq!(policy(), libc::SCHED_OTHER);
    }

    fn pin_to(cpu: usize) {
        // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes within
        // it; pid 0 is the calling thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }

    /// Issue 65: a mover busy on a core (a checkpoint being sealed) does
    /// not hold a watcher that became due on that core for its time slice.
    /// At one priority, round-robin kept the watcher waiting up to 100 ms.
    #[test]
    fn a_busy_mover_does_not_hold_a_watcher_for_its_time_slice() {
        let cpu = {
            // SAFETY: sched_getcpu takes nothing.
            let c = unsafe { libc::sched_getcpu() };
            c.max(0) as usize
        };
        let go = std::sync::Arc::new(std::sync::Barrier::new(2));
        let mover = {
            let go = go.clone();
            std::thread::spawn(move || {
                pin_to(cpu);
                let raised = raise_mover();
                go.wait();
                let t0 = std::time::Instant::now();
                while t0.elapsed() < std::time::Duration::from_millis(250) {
                    std::hint::spin_loop();
                }
                raised
            })
        };
        let watcher = std::thread::spawn(move || {
            pin_to(cpu);
            let raised = raise_watcher();
            go.wait();
            let mut worst = std::time::Duration::ZERO;
            let t0 = std::time::Instant::now();
            while t0.elapsed() < std::time::Duration::from_millis(200) {
                let asked = std::time::Instant::now();
                std::thread::sleep(std::time::Duration::from_millis(5));
                worst = worst.max(asked.elapsed().saturating_sub(std::time::Duration::from_millis(5)));
            }
            (raised, worst)
        });
        let (watcher_raised, worst) = watcher.join().unwrap();
        let mover_raised = mover.join().unwrap();
        if watcher_raised != Priority::RealTime || mover_raised != Priority::RealTime {
            eprintln!("no real-time scheduling here: nothing to judge");
            return;
        }
        assert!(worst < std::time::Duration::from_millis(30), "a watcher woke {worst:?} late behind a mover");
    }
}
