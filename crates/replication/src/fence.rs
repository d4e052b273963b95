//! Fencing: whether this side of a pair may let the VM's outputs (a
//! frame, a disk write, a flush) leave the host now. Exactly one side may
//! at any time, so the right is checked at the last moment before each
//! output's host I/O, in the network path and in the disk threads alike.
//!
//! A protected primary holds a *lease*. Its backup declares it failed only
//! after hearing nothing from it, on the channel or by heartbeat, for the
//! failure timeout. Each acknowledgement says how much of the log the
//! backup has received and the last heartbeat it heard; the primary knows
//! when it sent both, so it knows the backup cannot declare it failed
//! before the earlier of those moments plus the timeout. The lease runs to
//! there, less a margin for the two hosts' clock rates and for the time
//! between the check and the system call. A primary that stalled (stopped,
//! starved, its host suspended) finds its lease run out when it resumes,
//! and releases nothing until a fresh acknowledgement renews it or the
//! arbiter has decided: won, it acts alone; lost, never again.
//!
//! The clock is CLOCK_BOOTTIME: unlike the monotonic clock it goes on
//! counting while the host is suspended, which is a stall like any other.
//!
//! The window that remains: an output checked just before its lease runs
//! out, and then delayed between the check and its system call by more
//! than the margin, could leave after the backup went live. The margin
//! ([`MARGIN`]) is far longer than that code path runs; only a stop of the
//! process at exactly that instruction, longer than the margin, opens it.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Taken off every lease: the two hosts' clocks may run at rates a little
/// apart (a 1% allowance is far above what NTP-disciplined or even free
/// clocks drift), and the check comes a moment before the output leaves.
pub const MARGIN: Duration = Duration::from_millis(20);
/// Clock-rate allowance: parts per thousand of the timeout.
const RATE_ALLOWANCE_PER_MILLE: u64 = 10;

const LEASED: u8 = 0;
const ALONE: u8 = 1;
const DEPOSED: u8 = 2;

/// Nanoseconds of CLOCK_BOOTTIME.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the one we pass.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    debug_assert_eq!(r, 0, "CLOCK_BOOTTIME is always there on Linux");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// When a lease ends that the backup granted by hearing from us as late
/// as `heard_ns` (our clock), while it declares us failed after `timeout`
/// of silence: then plus the timeout, less the allowances.
pub fn lease_end(heard_ns: u64, timeout: Duration) -> u64 {
    let timeout_ns = timeout.as_nanos() as u64;
    let allowance = timeout_ns * RATE_ALLOWANCE_PER_MILLE / 1000 + MARGIN.as_nanos() as u64;
    (heard_ns + timeout_ns).saturating_sub(allowance)
}

/// This side's right to release outputs; clones share it.
#[derive(Clone)]
pub struct Fence(Arc<Inner>);

struct Inner {
    state: AtomicU8,
    /// CLOCK_BOOTTIME nanoseconds until which a leased side may act.
    until_ns: AtomicU64,
    /// Woken at every renewal and change of state, for [`Fence::wait`].
    changed: (Mutex<()>, Condvar),
}

/// Where a side stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Protected: may act while its lease runs.
    Leased,
    /// Unprotected (a plain VM, or the arbiter's winner): always may.
    Alone,
    /// Lost at the arbiter: never may again.
    Deposed,
}

impl Fence {
    fn with(state: u8) -> Fence {
        Fence(Arc::new(Inner {
            state: AtomicU8::new(state),
            until_ns: AtomicU64::new(0),
            changed: (Mutex::new(()), Condvar::new()),
        }))
    }

    /// A side on its own: a plain VM, or a backup that won and went live.
    pub fn alone() -> Fence {
        Fence::with(ALONE)
    }

    /// A protected primary's fence, with no lease yet: nothing leaves
    /// before the backup's first acknowledgement.
    pub fn leased() -> Fence {
        Fence::with(LEASED)
    }

    pub fn standing(&self) -> Standing {
        match self.0.state.load(Ordering::Acquire) {
            LEASED => Standing::Leased,
            ALONE => Standing::Alone,
            _ => Standing::Deposed,
        }
    }

    /// The backup heard from us as late as `heard_ns` (our clock): the
    /// lease runs to then plus `timeout`, less the allowances.
    pub fn renew(&self, heard_ns: u64, timeout: Duration) {
        self.renew_until(lease_end(heard_ns, timeout));
    }

    /// The lease runs to `until_ns` (see [`lease_end`]) unless it already
    /// runs further.
    pub fn renew_until(&self, until_ns: u64) {
        if until_ns > self.0.until_ns.fetch_max(until_ns, Ordering::AcqRel) {
            self.notify();
        }
    }

    /// A side that acted alone is protected again (a running VM given a
    /// backup): from now on it acts only while a lease runs. A deposed
    /// side stays deposed.
    pub fn lease(&self) {
        let _ = self.0.state.compare_exchange(ALONE, LEASED, Ordering::AcqRel, Ordering::Acquire);
        self.notify();
    }

    /// The arbiter's verdict: won (this side goes on alone).
    pub fn won(&self) {
        self.end_lease();
    }

    /// Protection ended on purpose, its end acknowledged by the backup
    /// (which then stops): this side acts alone. A deposed side stays
    /// deposed.
    pub fn end_lease(&self) {
        let _ = self.0.state.compare_exchange(LEASED, ALONE, Ordering::AcqRel, Ordering::Acquire);
        self.notify();
    }

    /// The arbiter's verdict: lost (the other side is live).
    pub fn deposed(&self) {
        self.0.state.store(DEPOSED, Ordering::Release);
        self.notify();
    }

    /// Whether outputs may leave now.
    pub fn allows(&self) -> bool {
        match self.0.state.load(Ordering::Acquire) {
            ALONE => true,
            LEASED => now_ns() < self.0.until_ns.load(Ordering::Acquire),
            _ => false,
        }
    }

    /// How long the lease still runs (zero when it has run out; None when
    /// no lease applies).
    pub fn lease_left(&self) -> Option<Duration> {
        (self.standing() == Standing::Leased)
            .then(|| Duration::from_nanos(self.0.until_ns.load(Ordering::Acquire).saturating_sub(now_ns())))
    }

    /// Waits until outputs may leave (true) or never will again (false).
    pub fn wait(&self) -> bool {
        let (lock, cv) = &self.0.changed;
        let mut guard = lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match self.standing() {
                Standing::Alone => return true,
                Standing::Deposed => return false,
                Standing::Leased if self.allows() => return true,
                // A renewal or a verdict wakes us; the timeout only bounds
                // a missed wake-up.
                Standing::Leased => {
                    guard = cv.wait_timeout(guard, Duration::from_millis(50)).unwrap_or_else(|e| e.into_inner()).0;
                }
            }
        }
    }

    fn notify(&self) {
        let (lock, cv) = &self.0.changed;
        let _guard = lock.lock().unwrap_or_else(|e| e.into_inner());
        cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_runs_out_and_a_verdict_is_final() {
        let f = Fence::leased();
        assert!(!f.allows(), "no lease before the first acknowledgement");
        f.renew(now_ns(), Duration::from_millis(500));
        assert!(f.allows());
        let left = f.lease_left().unwrap();
        assert!(left > Duration::from_millis(400) && left <= Duration::from_millis(480), "{left:?}");
        // Heard long ago: the lease has run out.
        let f = Fence::leased();
        f.renew(now_ns().saturating_sub(2_000_000_000), Duration::from_millis(500));
        assert!(!f.allows());
        f.won();
        assert!(f.allows() && f.wait());
        f.deposed();
        assert!(!f.allows() && !f.wait());
        f.won();
        assert_eq!(f.standing(), Standing::Deposed, "a deposed side stays deposed");
    }

    #[test]
    fn a_waiter_goes_on_at_a_renewal_or_stops_at_a_loss() {
        let f = Fence::leased();
        let g = f.clone();
        let waiter = std::thread::spawn(move || g.wait());
        std::thread::sleep(Duration::from_millis(100));
        assert!(!waiter.is_finished());
        f.renew(now_ns(), Duration::from_millis(500));
        assert!(waiter.join().unwrap());
        let f = Fence::leased();
        let g = f.clone();
        let waiter = std::thread::spawn(move || g.wait());
        std::thread::sleep(Duration::from_millis(50));
        f.deposed();
        assert!(!waiter.join().unwrap());
    }
}
