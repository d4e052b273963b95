//! The parts of fault tolerance that know nothing of the machine they
//! protect (VMware FT, ../../../shared/seeds/vmware-ft-techreport.txt §2-§3):
//!
//! - [`channel`]: the logging channel, a byte stream from primary to backup
//!   with acknowledgements back, bounded buffers on both ends and failure
//!   detection on its traffic;
//! - [`checkpoint_stream`]: what checkpoint mode (Remus) sends instead of
//!   a log: disk writes and whole checkpoints, in checkpoint order;
//! - [`disk_sync`]: the blocks that make the backup's copy of a disk the
//!   same as the primary's when protection starts;
//! - [`heartbeat`]: UDP heartbeats between the two hosts, each with a MAC;
//! - [`adaptive`]: the heartbeat timeout learned from the beats' arrival
//!   gaps, and the timeouts a backup promised its primary;
//! - [`pair_key`]: the secret the two hosts share, which keys the
//!   channel's handshake and the heartbeats;
//! - [`arbiter`]: the atomic test-and-set on shared storage that lets only
//!   one side go live;
//! - [`isolation`]: whether this host still reaches the outside, checked
//!   before contending at the arbiter so that the side that can serve wins;
//! - [`fence`]: whether this side may let outputs leave now: a lease the
//!   backup's acknowledgements renew, and the arbiter's verdict;
//! - [`output_rule`]: outputs held until the log that produced them is
//!   acknowledged;
//! - [`lag`]: the backup's execution lag, measured on the primary, and the
//!   CPU-share feedback loop that bounds it;
//! - [`duty`]: the pauses that hold the VM thread to a share of a core
//!   (the lag control's, and a VM's CPU limit);
//! - [`page_delta`]: checkpoint pages sent as XOR deltas or zstd (Remus §3.4);
//! - [`priority`]: the threads the peer's failure detector listens to,
//!   raised where the VM's threads cannot starve them;
//! - [`poll`]: reading a socket by polling while a round trip is awaited.
//!
//! The program drives a machine with these; nothing here runs guest code.

pub mod adaptive;
pub mod arbiter;
pub mod channel;
pub mod checkpoint_stream;
pub mod disk_sync;
pub mod duty;
pub mod fence;
pub mod heartbeat;
pub mod isolation;
pub mod lag;
pub mod output_rule;
pub mod page_delta;
pub mod pair_key;
pub mod poll;
pub mod priority;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Failure detection settings shared by both ends.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Silence after which the peer is declared failed: of the channel
    /// always, and of the heartbeats while nothing shorter was learned.
    pub timeout: Duration,
    /// The shortest heartbeat silence ever declared a failure: the floor
    /// of the timeout learned from the beats' arrivals (see [`adaptive`]).
    /// Equal to `timeout`, nothing is learned.
    pub min_timeout: Duration,
    /// How often each side shows it is alive (heartbeats, acknowledgements,
    /// keep-alive frames when the log is quiet).
    pub interval: Duration,
}

/// The default floor of the learned heartbeat timeout: six beats of 10 ms.
/// A crash is declared within it on a calm network, and a beat's path
/// (a real-time thread, one datagram) is rarely late by more on a host
/// that is not starved; a host whose beats are later learns a longer one.
pub const DEFAULT_MIN_TIMEOUT: Duration = Duration::from_millis(60);

impl Timing {
    /// Failure after 500 ms of silence at most, and after the timeout
    /// learned from the heartbeats' arrivals (60 ms at least) when the
    /// network is calm enough; heartbeats every 10 ms. VMware FT waits "a
    /// few seconds" over a datacenter network; our beats come from threads
    /// that never wait for the guest, so only a stalled host or a broken
    /// link silences them.
    pub const DEFAULT: Timing = Timing {
        timeout: Duration::from_millis(500),
        min_timeout: DEFAULT_MIN_TIMEOUT,
        interval: Duration::from_millis(10),
    };

    /// At most `timeout`, at least `min_timeout` (at most `timeout`).
    pub fn new(timeout: Duration, min_timeout: Duration) -> Timing {
        let min_timeout = min_timeout.min(timeout);
        // Six beats within the shortest timeout, within bounds that keep a
        // beat cheap and detection responsive.
        let interval = (min_timeout / 6).clamp(Duration::from_millis(5), Duration::from_millis(1000));
        Timing { timeout, min_timeout, interval }
    }

    /// At most `timeout`, with the default floor.
    pub fn with_timeout(timeout: Duration) -> Timing {
        Timing::new(timeout, DEFAULT_MIN_TIMEOUT)
    }
}

/// The failure detection settings of one side while its pair runs: the
/// primary can change the timeout on purpose, and sends the change to
/// its backup on the channel as a control entry (VMware FT §3.3), so
/// every thread that watches the peer (the detector, the heartbeats, the
/// acknowledgements and keep-alives) reads them each time it looks.
/// Clones share the settings.
#[derive(Debug, Clone)]
pub struct LiveTiming(Arc<LiveInner>);

#[derive(Debug)]
struct LiveInner {
    timeout_us: AtomicU64,
    min_timeout_us: AtomicU64,
    interval_us: AtomicU64,
    /// A longer timeout that still holds until then (see [`LiveTiming::follow`]).
    held: Mutex<Option<(Duration, Instant)>>,
}

impl LiveTiming {
    pub fn new(timing: Timing) -> LiveTiming {
        let t = LiveTiming(Arc::new(LiveInner {
            timeout_us: AtomicU64::new(0),
            min_timeout_us: AtomicU64::new(0),
            interval_us: AtomicU64::new(0),
            held: Mutex::new(None),
        }));
        t.set(timing);
        t
    }

    /// The settings now.
    pub fn get(&self) -> Timing {
        let us = |a: &AtomicU64| Duration::from_micros(a.load(Ordering::Relaxed));
        let mut timeout = us(&self.0.timeout_us);
        let mut held = self.0.held.lock().unwrap();
        match *held {
            Some((old, until)) if Instant::now() < until => timeout = timeout.max(old),
            Some(_) => *held = None,
            None => {}
        }
        Timing { timeout, min_timeout: us(&self.0.min_timeout_us).min(timeout), interval: us(&self.0.interval_us) }
    }

    /// From now on: `timing` (a reader may see the old timeout with the
    /// new interval for a moment; either pair is a sound setting).
    pub fn set(&self, timing: Timing) {
        self.0.timeout_us.store(timing.timeout.as_micros() as u64, Ordering::Relaxed);
        self.0.min_timeout_us.store(timing.min_timeout.as_micros() as u64, Ordering::Relaxed);
        self.0.interval_us.store(timing.interval.as_micros() as u64, Ordering::Relaxed);
    }

    /// A backup takes the timeout its primary sent: a longer one at once,
    /// a shorter one only a whole old timeout from now. The primary
    /// lowered its own lease to the shorter timeout before it sent it, but
    /// a lease it was granted under the old one may still run for up to
    /// the old timeout; declaring the primary failed sooner than that
    /// could let the backup go live while the primary still releases
    /// outputs. (Heartbeat timeouts told under the old one bind through
    /// [`adaptive::Promises`].) Like the primary's, see [`LiveTiming::fix`].
    pub fn follow(&self, timeout: Duration) {
        let now = self.get();
        if timeout < now.timeout {
            *self.0.held.lock().unwrap() = Some((now.timeout, Instant::now() + now.timeout));
        }
        self.fix(timeout);
    }

    /// From now on the peer is failed after exactly `timeout` of silence,
    /// of the channel or the beats: a timeout set through the control
    /// socket is the one the user wants, not a bound to learn within.
    /// The beats keep their pace: the other side, until it takes the
    /// change, still judges them by the timeout it learned.
    pub fn fix(&self, timeout: Duration) {
        let us = timeout.as_micros() as u64;
        self.0.timeout_us.store(us, Ordering::Relaxed);
        self.0.min_timeout_us.store(us, Ordering::Relaxed);
    }
}

impl From<Timing> for LiveTiming {
    fn from(timing: Timing) -> LiveTiming {
        LiveTiming::new(timing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backup given a shorter timeout keeps the old one for one old
    /// timeout (the primary's last lease under it may run that long); a
    /// longer one holds at once.
    #[test]
    fn a_followed_timeout_shortens_only_after_the_old_one_has_run() {
        let t = LiveTiming::new(Timing::new(Duration::from_millis(300), Duration::from_millis(60)));
        t.follow(Duration::from_millis(100));
        assert_eq!(t.get().timeout, Duration::from_millis(300));
        assert_eq!(t.get().min_timeout, Duration::from_millis(100), "fixed: nothing learned below it");
        assert_eq!(t.get().interval, Duration::from_millis(10), "the beats keep their pace");
        std::thread::sleep(Duration::from_millis(320));
        assert_eq!(t.get().timeout, Duration::from_millis(100));
        t.follow(Duration::from_millis(900));
        assert_eq!(t.get().timeout, Duration::from_millis(900));
        assert_eq!(t.get().min_timeout, Duration::from_millis(900));
        assert_eq!(t.get().interval, Duration::from_millis(10));
    }
}
