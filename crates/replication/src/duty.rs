//! Holding a thread to a share of one host core: after each run of the
//! VM, how long it rests. The lag control keeps a primary to the share
//! its backup can follow ([`crate::lag::Throttle`]); a VM's CPU limit
//! keeps it to what its user gave it. A cgroup's `cpu.max` would do the
//! latter for a whole process, but ftvm has no cgroup of its own on
//! every host, a limit must move with the VM to its backup within a run,
//! and only the VM thread may be held: the channel's and the disks'
//! threads starved with it would hold the primary's outputs and look
//! like a failure to its backup.

use std::time::Duration;

/// Pauses shorter than this are owed rather than taken: each sleep
/// overshoots by the timer slack and the wake-up (50-150 µs here), which
/// on chunks of a few hundred microseconds would take the thread far
/// below its share.
const MIN_PAUSE: Duration = Duration::from_millis(2);
/// The most oversleeping that is credited to later pauses.
const MAX_CREDIT: Duration = Duration::from_millis(5);

#[derive(Debug, Default)]
pub struct DutyCycle {
    /// Pause owed to the share and not yet taken, in seconds; below zero,
    /// time overslept that the next pauses give back.
    owed: f64,
}

impl DutyCycle {
    /// The pause that keeps the thread to `share` (0 to 1) after it ran
    /// for `busy`: what the share asks is owed, and taken once it adds
    /// up to [`MIN_PAUSE`]. Tell [`DutyCycle::paused`] how long the pause
    /// was.
    pub fn pause_after(&mut self, share: f64, busy: Duration) -> Duration {
        if share >= 1.0 {
            self.owed = 0.0;
            return Duration::ZERO;
        }
        self.owed += busy.as_secs_f64() * (1.0 - share) / share;
        if self.owed < MIN_PAUSE.as_secs_f64() {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(self.owed)
    }

    /// The thread paused for `slept` (a sleep may overshoot).
    pub fn paused(&mut self, slept: Duration) {
        self.owed = (self.owed - slept.as_secs_f64()).max(-MAX_CREDIT.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_is_held_to_its_share_with_few_long_enough_sleeps() {
        let mut d = DutyCycle::default();
        let (mut ran, mut rested, mut sleeps) = (Duration::ZERO, Duration::ZERO, 0);
        let chunk = Duration::from_micros(300);
        for i in 0..10_000 {
            ran += chunk;
            let pause = d.pause_after(0.25, chunk);
            if !pause.is_zero() {
                assert!(pause >= MIN_PAUSE, "{pause:?}");
                // Every third sleep oversleeps by 100 µs.
                let slept = pause + if i % 3 == 0 { Duration::from_micros(100) } else { Duration::ZERO };
                d.paused(slept);
                rested += slept;
                sleeps += 1;
            }
        }
        let share = ran.as_secs_f64() / (ran + rested).as_secs_f64();
        assert!((share - 0.25).abs() < 0.005, "{share}");
        assert!(sleeps < 10_000 / 2, "{sleeps} sleeps");
        // Unlimited: nothing owed, and nothing carried over to a later limit.
        assert_eq!(d.pause_after(1.0, Duration::from_secs(1)), Duration::ZERO);
        assert_eq!(d.pause_after(0.5, Duration::from_micros(100)), Duration::ZERO);
    }
}
