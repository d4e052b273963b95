//! How many guest instructions the host loop lets the machine run before
//! it looks at the host again (a slice): sized from how fast the guest ran
//! lately, so that a slice takes about [`SLICE_TIME`] of the host whether
//! translated code runs (billions of instructions a second) or the
//! interpreter does (a few hundred million).

use std::time::Duration;

/// What a slice should take. Short enough that a frame or a completion
/// waits at most about a millisecond for the guest; long enough that what
/// the loop does between slices costs little: two reads of the thread's
/// CPU clock (system calls that take the run queue's lock), the pacer, the
/// devices' and the pair's turns. At a fixed 200,000 instructions,
/// translated code ran 30,000 slices a second and the loop took about 5 %
/// of the host (the bare-metal SHA-256 job: 0.87 s of CPU against 0.83 s
/// with slices of 2,000,000).
pub const SLICE_TIME: Duration = Duration::from_micros(500);
/// The size of a slice at the start, and its least: about a millisecond
/// of the interpreter.
pub const LEAST: u64 = 200_000;
/// The most a slice runs, whatever the speed.
pub const MOST: u64 = 8_000_000;

/// The size of the next slice, in instructions.
#[derive(Debug, Clone, Copy)]
pub struct SliceSize {
    instructions: u64,
}

impl Default for SliceSize {
    fn default() -> Self {
        SliceSize { instructions: LEAST }
    }
}

impl SliceSize {
    pub fn instructions(&self) -> u64 {
        self.instructions
    }

    /// After a slice that ran `ran` instructions in `busy` of wall time.
    /// Only a slice that ran at least half its size tells the guest's
    /// speed (one that went idle, or stopped at an event or at the pair's
    /// bound, does not). The size moves halfway to what the speed asks, so
    /// that one slow slice (the host took the core away) does not halve
    /// the next.
    pub fn ran(&mut self, ran: u64, busy: Duration) {
        if ran < self.instructions / 2 || busy.is_zero() {
            return;
        }
        let wanted = ((ran as f64 * SLICE_TIME.as_secs_f64() / busy.as_secs_f64()) as u64).clamp(LEAST, MOST);
        // Halfway, rounded toward what is wanted (so that it is reached).
        let sum = self.instructions + wanted;
        self.instructions = if wanted > self.instructions { sum.div_ceil(2) } else { sum / 2 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settle(size: &mut SliceSize, per_ms: u64) {
        for _ in 0..40 {
            let ran = size.instructions();
            size.ran(ran, Duration::from_secs_f64(ran as f64 / per_ms as f64 / 1000.0));
        }
    }

    /// Translated code's speed gives slices of half a millisecond, up to
    /// the most; the interpreter's keeps the least; a slow slice moves the
    /// size only halfway, and a short one (idle, an event) not at all.
    #[test]
    fn a_slice_takes_about_half_a_millisecond_within_its_bounds() {
        let mut size = SliceSize::default();
        assert_eq!(size.instructions(), LEAST);
        settle(&mut size, 6_000_000); // 6 G instructions a second
        assert!((2_900_000..=3_000_000).contains(&size.instructions()), "{}", size.instructions());
        let before = size.instructions();
        size.ran(before, Duration::from_millis(50)); // preempted
        assert!(size.instructions() >= before / 2 - 1);
        size.ran(1000, Duration::from_millis(5)); // went idle
        assert!(size.instructions() >= before / 2 - 1);
        settle(&mut size, 100_000_000);
        assert_eq!(size.instructions(), MOST);
        settle(&mut size, 200_000);
        assert_eq!(size.instructions(), LEAST);
    }
}
