//! Epoch mode (Bressoud & Schneider §2, §4.3): instead of delivering each
//! input at the instruction where it arrived, as lockstep does, the
//! primary cuts execution into epochs of exactly N instructions (the
//! paper's recovery register is our instruction counter), buffers the
//! inputs that arrive during an epoch and delivers them all at its end,
//! where the log gets the epoch's inputs and its end mark ([end, E], a
//! go-live point) as one frame.
//!
//! The original protocol (P2) waits at every epoch end for the backup to
//! acknowledge everything sent before it delivers; the revised one (§4.3)
//! waits only before an output leaves, which is the Output Rule.
//!
//! Under the revised protocol an epoch end with nothing to deliver is a
//! point where nothing happens, so the primary runs through such ends
//! without stopping, up to the last end before its next look at the host
//! (the paper's primary took a recovery-register interrupt at each one).
//! One end mark then closes all the epochs of that run: the log is an
//! ordered stream, so [end, E] also says that E-1 and those before it
//! ended with nothing delivered, and the backup, which replays no further
//! than the end of the epoch after the last end mark it holds, still
//! never starts an epoch before the previous one's end has arrived.
//!
//! The backup runs each epoch while the primary does (P5): once it has
//! taken the frame of an end it runs on to the next end and waits there
//! for that end's frame (`replay::replay_log`). No log entry lies inside
//! an epoch, and the primary logs no second end at the instruction of
//! the last one unless the machine is idle there (`live`), so nothing the
//! backup runs past can come later. A failover goes live at the end of
//! the failover epoch (P6).
//!
//! One departure from the paper: HP-UX's idle loop spun, so its epochs
//! always ran to their length. A Linux guest waits in WFI, where no
//! instruction retires and an epoch would never end; so an epoch also ends
//! where every hart waits for an interrupt. That point is a function of
//! the instruction stream too, so both replicas see it at the same
//! instruction. The guest's timer needs no buffering either: it is part of
//! the deterministic machine (its clock follows the instruction count and
//! the logged clock events), where the paper's was the host's.

use crate::status::EpochSetting;
use ftvm_machine::RunExit;
use serde::{Deserialize, Serialize};

pub use ftvm_api::mode::EpochProtocol;

/// Shortest epoch accepted, in instructions: below it the loop's own
/// cost dwarfs the guest's.
pub const MIN_LENGTH: u64 = 256;
/// Longest epoch accepted, in instructions: above it the primary could be
/// silent for longer than a failure timeout (epoch ends are also its
/// keep-alives), and the guest's inputs would wait that long.
pub const MAX_LENGTH: u64 = 10_000_000;

/// An epoch length outside what either side accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--epoch-length {0} is out of range ({MIN_LENGTH} to {MAX_LENGTH} instructions)")]
pub struct EpochLengthError(pub u64);

/// The epoch mode a pair runs in, as the pair's header tells the backup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochMode {
    /// Instructions per epoch.
    pub length: u64,
    /// When the primary waits for the backup's acknowledgements.
    pub protocol: EpochProtocol,
}

impl EpochMode {
    /// The mode, if `length` is within [`MIN_LENGTH`]..=[`MAX_LENGTH`].
    pub fn new(length: u64, protocol: EpochProtocol) -> Result<EpochMode, EpochLengthError> {
        if !(MIN_LENGTH..=MAX_LENGTH).contains(&length) {
            return Err(EpochLengthError(length));
        }
        Ok(EpochMode { length, protocol })
    }

    /// The setting, as status shows it.
    pub fn setting(self) -> EpochSetting {
        EpochSetting { length: self.length, protocol: self.protocol.name().to_string() }
    }

    /// How the messages name it.
    pub fn describe(mode: Option<EpochMode>) -> String {
        match mode {
            None => "mode=lockstep".into(),
            Some(e) => e.setting().to_string(),
        }
    }

    /// The instruction count of the end of the epoch `icount` is in (an
    /// epoch that starts at `icount` ends one length later).
    pub fn next_end(self, icount: u64) -> u64 {
        (icount / self.length + 1) * self.length
    }

    /// Where a run starting at `icount` stops, given where the live loop
    /// would next look at the host (`look_at`): at the end of the current
    /// epoch when inputs wait for it or the protocol waits at every end;
    /// otherwise (revised, nothing waiting) at the last epoch end before
    /// `look_at`. With epochs longer than that, at `look_at`, inside the
    /// epoch.
    pub fn run_target(self, icount: u64, look_at: u64, inputs_waiting: bool) -> u64 {
        let next = self.next_end(icount);
        if self.protocol == EpochProtocol::Revised && !inputs_waiting {
            let last = look_at / self.length * self.length;
            if last > icount {
                return last;
            }
        }
        next.min(look_at)
    }

    /// Whether the machine, stopped at its instruction count with `exit`,
    /// stands at an epoch end.
    pub fn is_end(self, icount: u64, exit: &RunExit) -> bool {
        icount.is_multiple_of(self.length) || matches!(exit, RunExit::Idle { .. })
    }
}

pub mod backup;
pub mod primary;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_end_at_multiples_of_the_length_or_when_idle() {
        let e = EpochMode::new(4096, EpochProtocol::Revised).unwrap();
        assert_eq!(e.next_end(0), 4096);
        assert_eq!(e.next_end(4095), 4096);
        assert_eq!(e.next_end(4096), 8192);
        assert!(e.is_end(8192, &RunExit::Reached));
        assert!(!e.is_end(8191, &RunExit::Reached));
        assert!(!e.is_end(8191, &RunExit::Io));
        assert!(e.is_end(8191, &RunExit::Idle { wake_at: None }));
    }

    #[test]
    fn lengths_out_of_range_are_refused() {
        assert!(EpochMode::new(100, EpochProtocol::Original).is_err());
        assert!(EpochMode::new(MAX_LENGTH + 1, EpochProtocol::Original).is_err());
        assert!(EpochMode::new(MAX_LENGTH, EpochProtocol::Original).is_ok());
        // An unknown protocol in a peer's header is refused by serde.
        assert!(serde_json::from_str::<EpochMode>(r#"{"length":1024,"protocol":"sometimes"}"#).is_err());
    }

    #[test]
    fn the_revised_protocol_runs_through_ends_with_nothing_to_deliver() {
        let revised = EpochMode::new(1000, EpochProtocol::Revised).unwrap();
        let original = EpochMode::new(1000, EpochProtocol::Original).unwrap();
        // Nothing waiting: on to the last end before the loop's next look.
        assert_eq!(revised.run_target(1500, 201_500, false), 201_000);
        // Inputs waiting, or the original protocol: the current epoch's end.
        assert_eq!(revised.run_target(1500, 201_500, true), 2000);
        assert_eq!(original.run_target(1500, 201_500, false), 2000);
        // No end before the look: stop there, inside the epoch.
        let long = EpochMode::new(1_000_000, EpochProtocol::Revised).unwrap();
        assert_eq!(long.run_target(1500, 201_500, false), 201_500);
        assert_eq!(long.run_target(999_000, 1_199_000, false), 1_000_000);
    }
}
