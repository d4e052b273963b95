//! Virtual time. The platform timer (`mtime`) is a pure function of the
//! machine's instruction count and a few parameters that change only
//! through injected events: a rate (timer ticks per instruction) and
//! forward jumps taken while every hart is idle. A live host keeps guest
//! time close to the wall clock by choosing those events; a replaying host
//! takes them from the log. Nothing here reads the host clock.

/// Fixed-point scale of the rate: ticks per instruction times 2^32.
pub const RATE_ONE: u64 = 1 << 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VirtualClock {
    base_icount: u64,
    base_ticks: u64,
    rate: u64,
}

impl VirtualClock {
    pub fn new(rate: u64) -> VirtualClock {
        VirtualClock { base_icount: 0, base_ticks: 0, rate }
    }

    /// The rate for a nominal guest speed, in instructions per second, at
    /// a timer frequency in Hz.
    pub fn rate_for(instructions_per_second: u64, timer_hz: u64) -> u64 {
        ((timer_hz as u128 * RATE_ONE as u128) / instructions_per_second.max(1) as u128) as u64
    }

    pub fn rate(&self) -> u64 {
        self.rate
    }

    #[inline]
    pub fn ticks_at(&self, icount: u64) -> u64 {
        let delta = icount.saturating_sub(self.base_icount) as u128;
        self.base_ticks + ((delta * self.rate as u128) >> 32) as u64
    }

    /// The first instruction count at which the timer reads at least
    /// `ticks`, or `None` if it never will (rate zero).
    pub fn icount_reaching(&self, ticks: u64) -> Option<u64> {
        if ticks <= self.base_ticks {
            return Some(self.base_icount);
        }
        if self.rate == 0 {
            return None;
        }
        let need = ((ticks - self.base_ticks) as u128) << 32;
        let delta = need.div_ceil(self.rate as u128);
        Some(self.base_icount.saturating_add(delta.min(u64::MAX as u128) as u64))
    }

    /// Change the rate from `icount` on, keeping time continuous.
    pub fn set_rate(&mut self, icount: u64, rate: u64) {
        self.base_ticks = self.ticks_at(icount);
        self.base_icount = icount;
        self.rate = rate;
    }

    /// Jump forward to `ticks` at `icount` (while idle). Never goes back.
    pub fn advance_to(&mut self, icount: u64, ticks: u64) {
        let now = self.ticks_at(icount);
        self.base_icount = icount;
        self.base_ticks = now.max(ticks);
    }

    pub fn to_parts(&self) -> (u64, u64, u64) {
        (self.base_icount, self.base_ticks, self.rate)
    }

    pub fn from_parts(base_icount: u64, base_ticks: u64, rate: u64) -> VirtualClock {
        VirtualClock { base_icount, base_ticks, rate }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_invert_ticks_exactly() {
        let c = VirtualClock::new(VirtualClock::rate_for(300_000_000, 10_000_000));
        for t in [1u64, 7, 1000, 123_456_789] {
            let n = c.icount_reaching(t).unwrap();
            assert!(c.ticks_at(n) >= t);
            assert!(n == 0 || c.ticks_at(n - 1) < t);
        }
    }

    #[test]
    fn rate_changes_and_jumps_keep_time_monotonic() {
        let mut c = VirtualClock::new(RATE_ONE / 10);
        let t1 = c.ticks_at(1000);
        c.set_rate(1000, RATE_ONE / 2);
        assert_eq!(c.ticks_at(1000), t1);
        assert_eq!(c.ticks_at(1010), t1 + 5);
        c.advance_to(1010, t1 + 1000);
        assert_eq!(c.ticks_at(1010), t1 + 1000);
        c.advance_to(1010, 0);
        assert_eq!(c.ticks_at(1010), t1 + 1000);
    }
}
