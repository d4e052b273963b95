//! The heartbeat timeout a side learns from its peer's beats (issue 31):
//! a crash on a calm network is declared within a few beats, and a side
//! whose beats arrive late (a loaded host, a jittery link) waits longer
//! rather than failing over for nothing.
//!
//! The rule is a multiple of the longest gap between two beats heard in
//! the last minute, within the options' floor and ceiling. A phi-accrual
//! detector fits a normal distribution to the gaps instead; the gaps here
//! are not normal (a host's stalls make a long thin tail), and a bound on
//! the longest one seen says plainly what a user may expect.
//!
//! A backup's timeout bounds its primary's lease (see [`crate::fence`]),
//! so each acknowledgement tells the primary the timeout the backup
//! judges by, and the backup keeps its word: a timeout it told is kept,
//! even if it learns a shorter one, until a lease granted under it has
//! run out ([`Promises`]).

use crate::Timing;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How many times the longest recent gap a beat's silence must last to be
/// a failure.
pub const GAP_FACTOR: u32 = 4;
/// How long a gap is remembered: long enough to hold a loaded host's
/// periodic stalls, short enough to come down again after a burst of load.
const WINDOW: Duration = Duration::from_secs(60);
/// The window is kept as the longest gap of each of these spans.
const SPAN: Duration = Duration::from_secs(1);
const SPANS: usize = (WINDOW.as_secs() / SPAN.as_secs()) as usize;
/// Beats heard before what they show is trusted: until then the ceiling
/// holds (two seconds of beats at the default interval).
pub const LEARNING_BEATS: u32 = 200;

/// The gaps between the beats heard from the peer.
#[derive(Debug)]
pub struct ArrivalGaps {
    start: Instant,
    inner: Mutex<Gaps>,
}

#[derive(Debug)]
struct Gaps {
    last: Option<Instant>,
    beats: u32,
    /// The longest gap (µs) ending in each span, by the span's number since
    /// `start`; a slot holds the span `number % SPANS`.
    spans: [(u64, u64); SPANS],
}

impl Default for ArrivalGaps {
    fn default() -> ArrivalGaps {
        ArrivalGaps::new()
    }
}

impl ArrivalGaps {
    pub fn new() -> ArrivalGaps {
        ArrivalGaps {
            start: Instant::now(),
            inner: Mutex::new(Gaps { last: None, beats: 0, spans: [(u64::MAX, 0); SPANS] }),
        }
    }

    fn span(&self, at: Instant) -> u64 {
        (at.saturating_duration_since(self.start).as_micros() / SPAN.as_micros()) as u64
    }

    /// A beat was heard at `at`.
    pub fn heard(&self, at: Instant) {
        let span = self.span(at);
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(last) = g.last.replace(at) {
            let gap = at.saturating_duration_since(last).as_micros() as u64;
            let slot = &mut g.spans[span as usize % SPANS];
            if slot.0 != span {
                *slot = (span, 0);
            }
            slot.1 = slot.1.max(gap);
            g.beats = g.beats.saturating_add(1);
        }
    }

    /// The longest gap between beats heard in the last minute (the
    /// silence going on is what the timeout judges, not part of it); None
    /// while too few beats were heard to judge by.
    pub fn longest(&self, now: Instant) -> Option<Duration> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.beats < LEARNING_BEATS {
            return None;
        }
        let current = self.span(now);
        let oldest = current.saturating_sub(SPANS as u64 - 1);
        let kept = g.spans.iter().filter(|(span, _)| (oldest..=current).contains(span)).map(|&(_, gap)| gap);
        Some(Duration::from_micros(kept.max().unwrap_or(0)))
    }

    /// The heartbeat timeout to judge by now under `timing`: [`GAP_FACTOR`]
    /// times the longest recent gap, at least `timing.min_timeout`, at most
    /// `timing.timeout` (which also holds while there is too little to
    /// judge by).
    pub fn timeout(&self, timing: Timing, now: Instant) -> Duration {
        match self.longest(now) {
            None => timing.timeout,
            Some(gap) => (gap * GAP_FACTOR).clamp(timing.min_timeout, timing.timeout),
        }
    }
}

/// The heartbeat timeouts a backup told its primary, each binding until a
/// lease granted under it has run out: told at `t0`, a timeout `T` may have
/// let the primary act until `t0 + T` at the latest (the beat it was
/// reckoned from was heard before `t0`).
#[derive(Debug, Default)]
pub struct Promises(Mutex<VecDeque<(Duration, Instant)>>);

impl Promises {
    /// `timeout` is being told now.
    pub fn told(&self, timeout: Duration) {
        let now = Instant::now();
        let until = now + timeout;
        let mut p = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // What runs out, or binds less and no longer than this, is implied.
        p.retain(|&(t, u)| u > now && !(t <= timeout && u <= until));
        p.push_back((timeout, until));
    }

    /// The longest timeout still binding now (zero if none).
    pub fn binding(&self) -> Duration {
        let now = Instant::now();
        let p = self.0.lock().unwrap_or_else(|e| e.into_inner());
        p.iter().filter(|&&(_, u)| u > now).map(|&(t, _)| t).max().unwrap_or(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> Timing {
        Timing::new(Duration::from_millis(500), Duration::from_millis(60))
    }

    #[test]
    fn the_ceiling_holds_until_enough_beats_were_heard() {
        let g = ArrivalGaps::new();
        let t0 = Instant::now();
        for i in 0..LEARNING_BEATS {
            g.heard(t0 + Duration::from_millis(10) * i);
        }
        let at = t0 + Duration::from_millis(10) * LEARNING_BEATS;
        assert_eq!(g.timeout(timing(), at), Duration::from_millis(500), "one gap short");
        g.heard(at);
        assert_eq!(g.timeout(timing(), at), Duration::from_millis(60), "calm: the floor");
    }

    #[test]
    fn a_long_gap_lengthens_the_timeout_for_a_minute() {
        let g = ArrivalGaps::new();
        let t0 = Instant::now();
        let mut at = t0;
        for _ in 0..=LEARNING_BEATS {
            at += Duration::from_millis(10);
            g.heard(at);
        }
        // One beat 30 ms late: four times that.
        at += Duration::from_millis(30);
        g.heard(at);
        assert_eq!(g.timeout(timing(), at), Duration::from_millis(120));
        // Beats on time for 59 s more: still remembered.
        for _ in 0..5900 {
            at += Duration::from_millis(10);
            g.heard(at);
        }
        assert_eq!(g.timeout(timing(), at), Duration::from_millis(120));
        // Two seconds later it has left the window.
        for _ in 0..200 {
            at += Duration::from_millis(10);
            g.heard(at);
        }
        assert_eq!(g.timeout(timing(), at), Duration::from_millis(60));
        // A stall of 200 ms: the ceiling.
        at += Duration::from_millis(200);
        g.heard(at);
        assert_eq!(g.timeout(timing(), at), Duration::from_millis(500));
    }

    #[test]
    fn the_silence_going_on_is_judged_not_learned() {
        let g = ArrivalGaps::new();
        let t0 = Instant::now();
        for i in 0..=LEARNING_BEATS {
            g.heard(t0 + Duration::from_millis(10) * i);
        }
        let last = t0 + Duration::from_millis(10) * LEARNING_BEATS;
        assert_eq!(g.timeout(timing(), last + Duration::from_millis(45)), Duration::from_millis(60));
    }

    #[test]
    fn a_promise_binds_until_its_lease_could_have_run_out() {
        let p = Promises::default();
        assert_eq!(p.binding(), Duration::ZERO);
        p.told(Duration::from_millis(300));
        p.told(Duration::from_millis(60));
        assert_eq!(p.binding(), Duration::from_millis(300), "the longer one still binds");
        std::thread::sleep(Duration::from_millis(320));
        p.told(Duration::from_millis(60));
        assert_eq!(p.binding(), Duration::from_millis(60));
        assert_eq!(p.0.lock().unwrap().len(), 1, "what is implied is not kept");
    }
}
