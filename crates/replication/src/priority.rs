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
const RT_PRIORITY: i32 = 5;
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

/// Raises the calling thread to a watcher's priority.
pub fn raise_watcher() -> Priority {
    let param = libc::sched_param { sched_priority: RT_PRIORITY };
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
}
