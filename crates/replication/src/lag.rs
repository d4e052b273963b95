//! Execution lag and its control (VMware FT §3.2).
//!
//! The backup's acknowledgements carry the instruction count it has
//! executed. The primary keeps a short history of when it was at which
//! instruction count, so the lag in real time is how long ago the primary
//! was where the backup is now. When the lag passes a threshold the
//! primary's CPU share is lowered a few percent at a time, in a slow
//! feedback loop, and given back as the backup catches up.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// History kept beyond the backup's position, at most.
const HISTORY: usize = 1 << 16;

#[derive(Default)]
pub struct LagMeter {
    /// (instruction count, when the primary reached it), increasing.
    samples: VecDeque<(u64, Instant)>,
}

impl LagMeter {
    /// The primary ran from where it was last noted, starting at
    /// `started`, and has executed up to `icount` now.
    pub fn note(&mut self, icount: u64, started: Instant, now: Instant) {
        // It was still at the last count when this run started: after an
        // idle stretch, a backup that has caught up to it is not behind by
        // the length of that stretch.
        if let Some((_, t)) = self.samples.back_mut() {
            *t = (*t).max(started);
        }
        if self.samples.back().is_none_or(|(i, _)| icount > *i) {
            if self.samples.len() == HISTORY {
                self.samples.pop_front();
            }
            self.samples.push_back((icount, now));
        }
    }

    /// How far behind the backup, at `backup_icount`, is at `now`.
    pub fn lag(&mut self, backup_icount: u64, now: Instant) -> Duration {
        // Samples the backup has passed are of no more use.
        while self.samples.len() > 1 && self.samples[1].0 <= backup_icount {
            self.samples.pop_front();
        }
        match self.samples.front() {
            // The primary was at or just past the backup's position then.
            Some(&(i, t)) if i >= backup_icount => now.saturating_duration_since(t),
            // Between the first and second sample: the second is when the
            // primary got past it.
            Some(_) => self.samples.get(1).map_or(Duration::ZERO, |&(_, t)| now.saturating_duration_since(t)),
            None => Duration::ZERO,
        }
    }
}

/// The primary's CPU share: 1.0 runs flat out.
pub struct Throttle {
    share: f64,
    threshold: Duration,
    last_update: Instant,
}

/// How often the share moves.
const STEP_EVERY: Duration = Duration::from_millis(250);
const MIN_SHARE: f64 = 0.05;

impl Throttle {
    pub fn new(threshold: Duration) -> Throttle {
        Throttle { share: 1.0, threshold, last_update: Instant::now() }
    }

    pub fn share(&self) -> f64 {
        self.share
    }

    /// Moves the share a step given the current lag: down a few percent
    /// while the lag is over the threshold, back up while it is under
    /// half of it.
    pub fn update(&mut self, lag: Duration, now: Instant) {
        if now.duration_since(self.last_update) < STEP_EVERY {
            return;
        }
        self.last_update = now;
        if lag > self.threshold {
            self.share = (self.share * 0.95).max(MIN_SHARE);
        } else if lag < self.threshold / 2 {
            self.share = (self.share * 1.05 + 0.01).min(1.0);
        }
    }

    /// The pause that keeps the primary to its share after it ran for
    /// `busy`.
    pub fn pause_after(&self, busy: Duration) -> Duration {
        if self.share >= 1.0 {
            return Duration::ZERO;
        }
        busy.mul_f64((1.0 - self.share) / self.share)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_how_long_ago_the_primary_was_there() {
        let t0 = Instant::now();
        let mut m = LagMeter::default();
        // Runs of 100 ms, back to back.
        for k in 0..10u64 {
            let started = t0 + Duration::from_millis(k.saturating_sub(1) * 100);
            m.note(k * 1000, started, t0 + Duration::from_millis(k * 100));
        }
        let now = t0 + Duration::from_millis(900);
        // The backup only moves forward.
        assert_eq!(m.lag(5000, now), Duration::from_millis(400));
        // Between samples: the primary passed 5500 by the 600 ms sample.
        assert_eq!(m.lag(5500, now), Duration::from_millis(300));
        assert_eq!(m.lag(9000, now), Duration::ZERO);
        assert_eq!(m.lag(20_000, now), Duration::ZERO);
    }

    #[test]
    fn an_idle_stretch_both_sides_sat_through_is_no_lag() {
        let t0 = Instant::now();
        let mut m = LagMeter::default();
        m.note(1000, t0, t0);
        // The guest idles 3 s at 1000, then runs on for 10 ms.
        let woke = t0 + Duration::from_secs(3);
        m.note(2000, woke, woke + Duration::from_millis(10));
        // The backup stands where the primary slept.
        assert_eq!(m.lag(1000, woke + Duration::from_millis(20)), Duration::from_millis(20));
        assert_eq!(m.lag(1500, woke + Duration::from_millis(20)), Duration::from_millis(10));
    }

    #[test]
    fn share_falls_under_lag_and_recovers() {
        let t0 = Instant::now();
        let mut th = Throttle::new(Duration::from_secs(1));
        let mut now = t0;
        for _ in 0..20 {
            now += STEP_EVERY;
            th.update(Duration::from_secs(3), now);
        }
        assert!(th.share() < 0.4 && th.share() >= MIN_SHARE, "{}", th.share());
        assert!(th.pause_after(Duration::from_millis(10)) > Duration::from_millis(10));
        for _ in 0..100 {
            now += STEP_EVERY;
            th.update(Duration::from_millis(10), now);
        }
        assert_eq!(th.share(), 1.0);
        assert_eq!(th.pause_after(Duration::from_millis(10)), Duration::ZERO);
    }
}
