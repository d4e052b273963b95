//! Failure detection (VMware FT §2.3): why a peer is declared failed,
//! the first such declaration kept, and the detector that declares one
//! when the channel or the heartbeats fall silent. Shared by both ends.

use crate::heartbeat::Heartbeat;
use crate::Timing;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Why a peer was declared failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The connection closed or broke.
    Closed(String),
    /// Nothing on the channel for the timeout.
    ChannelSilent(Duration),
    /// No heartbeat for the timeout.
    HeartbeatSilent(Duration),
    /// The backup refused to follow (its reason).
    Refused(String),
    /// What came on the channel was not sealed by the peer's key in its
    /// place: forged, changed, replayed or reordered.
    Unauthentic,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            Failure::Closed(why) => write!(f, "the logging channel closed ({why})"),
            Failure::ChannelSilent(d) => write!(f, "nothing on the logging channel for {} ms", d.as_millis()),
            Failure::HeartbeatSilent(d) => write!(f, "no heartbeat for {} ms", d.as_millis()),
            Failure::Refused(why) => write!(f, "the backup refused: {why}"),
            Failure::Unauthentic => write!(f, "the logging channel carried data not sealed by the pair's key"),
        }
    }
}

/// Records `f` as the peer's failure unless one already was: true if it
/// is the first, whom the caller then tells whoever listens (once).
pub(super) fn declare(failed: &Mutex<Option<Failure>>, f: &Failure) -> bool {
    let mut slot = failed.lock().unwrap();
    if slot.is_some() {
        return false;
    }
    *slot = Some(f.clone());
    true
}

/// The failure detector's loop: watches the peer's channel traffic and
/// heartbeats until one is silent for the timeout or the end is stopped.
pub(super) fn detect(
    timing: Timing,
    heartbeat: &Mutex<Option<Heartbeat>>,
    stop: &AtomicBool,
    failed: &Mutex<Option<Failure>>,
    channel_silence: impl Fn() -> Duration,
    fail: impl Fn(Failure),
) {
    let tick = (timing.interval / 2).max(Duration::from_millis(1));
    loop {
        std::thread::sleep(tick);
        if stop.load(Ordering::Relaxed) || failed.lock().unwrap().is_some() {
            return;
        }
        let quiet = channel_silence();
        if quiet > timing.timeout {
            return fail(Failure::ChannelSilent(quiet));
        }
        if let Some(hb) = &*heartbeat.lock().unwrap() {
            let quiet = hb.silence();
            if quiet > timing.timeout {
                return fail(Failure::HeartbeatSilent(quiet));
            }
        }
    }
}
