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

/// How much later than asked the detector may wake before it takes the
/// delay for a stall of its own host: a quarter of the shortest timeout
/// it judges by (a peer's real silence is then still judged within the
/// timeout and a beat).
fn own_stall(shortest: Duration) -> Duration {
    shortest / 4
}

/// The failure detector's loop: watches the peer's channel traffic and
/// heartbeats until the channel is silent for the timeout, or the beats
/// for the heartbeat timeout (`beat_timeout`, at most the timeout), or the
/// end is stopped. `timing` says the settings at each look (they may
/// change meanwhile).
pub(super) fn detect(
    timing: impl Fn() -> Timing,
    heartbeat: &Mutex<Option<Heartbeat>>,
    beat_timeout: impl Fn(&Heartbeat, Timing) -> Duration,
    stop: &AtomicBool,
    failed: &Mutex<Option<Failure>>,
    channel_silence: impl Fn() -> Duration,
    fail: impl Fn(Failure),
) {
    // After this side's own stall, the peer is not judged until then.
    let mut judge_from = std::time::Instant::now();
    let mut last_look = std::time::Instant::now();
    loop {
        let timing = timing();
        let tick = (timing.interval / 2).max(Duration::from_millis(1));
        std::thread::sleep(tick);
        if stop.load(Ordering::Relaxed) || failed.lock().unwrap().is_some() {
            return;
        }
        let beats = heartbeat.lock().unwrap().as_ref().map(|hb| (hb.silence(), beat_timeout(hb, timing)));
        // Woken far later than asked: this host, not the peer, stalled
        // (stopped, suspended, or starved of CPU). What the peer sent
        // meanwhile may still be waiting to be read by threads that
        // stalled too, so its silence says nothing until they have had
        // a couple of beats to catch up.
        let late = last_look.elapsed().saturating_sub(tick);
        last_look = std::time::Instant::now();
        if late > own_stall(beats.map_or(timing.timeout, |(_, t)| t.min(timing.timeout))) {
            judge_from = std::time::Instant::now() + timing.interval * 2;
        }
        if std::time::Instant::now() < judge_from {
            continue;
        }
        let quiet = channel_silence();
        if quiet > timing.timeout {
            return fail(Failure::ChannelSilent(quiet));
        }
        if let Some((quiet, limit)) = beats {
            if quiet > limit {
                return fail(Failure::HeartbeatSilent(quiet));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::time::Instant;

    /// This side stalls (here: a look at the channel that takes 300 ms,
    /// as a host that got no CPU would) and finds the peer silent when it
    /// wakes: the peer is judged only two beats later, once this side's
    /// threads have had the time to read what came meanwhile.
    #[test]
    fn a_stall_of_our_own_is_not_taken_for_the_peers_silence() {
        let timing = Timing {
            timeout: Duration::from_millis(200),
            min_timeout: Duration::from_millis(200),
            interval: Duration::from_millis(20),
        };
        let looks = AtomicU32::new(0);
        let woke = Mutex::new(None);
        let declared = Mutex::new(None);
        detect(
            || timing,
            &Mutex::new(None),
            |_, t| t.timeout,
            &AtomicBool::new(false),
            &Mutex::new(None),
            || {
                if looks.fetch_add(1, Ordering::Relaxed) == 0 {
                    std::thread::sleep(Duration::from_millis(300));
                    *woke.lock().unwrap() = Some(Instant::now());
                    return Duration::ZERO;
                }
                Duration::from_secs(1)
            },
            |f| *declared.lock().unwrap() = Some((f, Instant::now())),
        );
        let (f, at) = declared.into_inner().unwrap().expect("declared");
        assert!(matches!(f, Failure::ChannelSilent(_)), "{f:?}");
        let after = at - woke.into_inner().unwrap().unwrap();
        assert!(after >= timing.interval * 2, "judged {after:?} after the stall");
    }
}
