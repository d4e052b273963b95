//! The backup's side of epoch mode: the replay of lockstep, checking the
//! epoch rule as it goes (every input falls on an epoch end).

use super::EpochMode;
use ftvm_machine::DeterministicEngine;
use ftvm_replay::replayer::{FrameRule, HookError};

/// The backup's check of the epoch rule while it replays: every input the
/// log carries must fall on an epoch end, where the backup's machine is
/// either at a multiple of the length or idle. A log that breaks it came
/// from a primary that delivered inside an epoch.
pub struct EpochCheck {
    /// The epoch mode the primary runs in.
    pub mode: EpochMode,
    /// Inputs checked.
    pub inputs: u64,
    /// Of them, those at idle ends rather than at a multiple of the length.
    pub at_idle: u64,
}

impl EpochCheck {
    /// A check of `mode`'s rule, with no inputs checked yet.
    pub fn new(mode: EpochMode) -> EpochCheck {
        EpochCheck { mode, inputs: 0, at_idle: 0 }
    }
}

/// P1 broken: an input delivered inside an epoch while the guest ran.
#[derive(Debug, thiserror::Error)]
#[error(
    "the primary delivered an input at instruction {icount}, inside epoch {} (length {length}), with a hart running",
    .icount / .length
)]
pub struct InputInsideEpoch {
    /// The instruction count the input was delivered at.
    pub icount: u64,
    /// Instructions per epoch.
    pub length: u64,
}

impl FrameRule for EpochCheck {
    /// P5: with the last end's frame taken, the backup runs on to the end
    /// of the epoch that began there.
    fn run_ahead_to(&self, icount: u64) -> Option<u64> {
        Some(self.mode.next_end(icount))
    }

    fn input(&mut self, m: &dyn DeterministicEngine) -> Result<(), HookError> {
        self.inputs += 1;
        let icount = m.icount();
        if icount.is_multiple_of(self.mode.length) {
            return Ok(());
        }
        if m.all_harts_idle() {
            self.at_idle += 1;
            return Ok(());
        }
        Err(Box::new(InputInsideEpoch { icount, length: self.mode.length }))
    }

    fn inputs_checked(&self) -> Option<(u64, u64)> {
        Some((self.inputs, self.inputs - self.at_idle))
    }

    fn summary(&self) -> String {
        format!(
            "; {} inputs, each at an epoch end ({} at multiples of {}, {} where the guest idled)",
            self.inputs,
            self.inputs - self.at_idle,
            self.mode.length,
            self.at_idle
        )
    }
}
