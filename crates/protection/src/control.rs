//! Control entries (VMware FT §3.3): an operation made on the primary
//! that changes what the backup must do travels to it on the logging
//! channel, in the stream, never by hand on the backup's host. The
//! stream carries them as opaque bytes (the replay log's
//! `Entry::Control`, the checkpoint stream's `Record::Control`); this is
//! what the bytes say.
//!
//! Stopping protection is not one of them: it ends the stream itself
//! (an end mark where inputs may be delivered), which the backup follows
//! to its end.
//!
//! ```text
//! kind 1, the failure timeout: milliseconds u32
//! kind 2, the VM's CPU limit: percent of one host core u8 (100: none)
//! ```

use crate::error::PeerError;
use std::time::Duration;

const TIMEOUT: u8 = 1;
const CPU_LIMIT: u8 = 2;

pub use ftvm_api::limits::{Bounded, CPU_LIMIT_PERCENT, TIMEOUT_MS};

/// A change the backup makes because the primary made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlEntry {
    /// Declare the other side failed after this much silence (both sides:
    /// the primary takes it first, the backup as it reads it).
    Timeout(Duration),
    /// The VM may use at most this percentage of a host core (a resource
    /// setting, VMware FT §3.3's "CPU share"): the backup keeps it, and
    /// its VM runs under it once it goes live.
    CpuLimit(u8),
}

impl ControlEntry {
    /// The entry's bytes in the stream.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            ControlEntry::Timeout(t) => {
                let mut out = vec![TIMEOUT];
                out.extend((t.as_millis().min(u32::MAX as u128) as u32).to_le_bytes());
                out
            }
            ControlEntry::CpuLimit(percent) => vec![CPU_LIMIT, *percent],
        }
    }

    /// An entry from the stream; what is not one (an unknown kind, a
    /// timeout out of range) is a stream the backup cannot follow.
    pub fn decode(bytes: &[u8]) -> Result<ControlEntry, PeerError> {
        match bytes {
            [TIMEOUT, ms @ ..] if ms.len() == 4 => {
                let ms = u32::from_le_bytes(ms.try_into().expect("4 bytes")) as u64;
                if !TIMEOUT_MS.contains(ms) {
                    return Err(PeerError::Control(format!("a failure timeout of {ms} ms")));
                }
                Ok(ControlEntry::Timeout(Duration::from_millis(ms)))
            }
            [CPU_LIMIT, percent] if CPU_LIMIT_PERCENT.contains(*percent) => Ok(ControlEntry::CpuLimit(*percent)),
            [CPU_LIMIT, ..] => Err(PeerError::Control(format!("a CPU limit entry of {} bytes", bytes.len()))),
            [kind, ..] => Err(PeerError::Control(format!("an entry of unknown kind {kind}"))),
            [] => Err(PeerError::Control("an empty entry".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_decode_as_encoded_and_nothing_else_does() {
        for e in
            [ControlEntry::Timeout(Duration::from_millis(1500)), ControlEntry::CpuLimit(5), ControlEntry::CpuLimit(100)]
        {
            assert_eq!(ControlEntry::decode(&e.encode()).unwrap(), e);
        }
        for bad in [
            &[][..],
            &[9, 0, 0, 0, 0],
            &[TIMEOUT, 1, 0],
            &[TIMEOUT, 5, 0, 0, 0],
            &[TIMEOUT, 0xff, 0xff, 0xff, 0xff],
            &[CPU_LIMIT],
            &[CPU_LIMIT, 0],
            &[CPU_LIMIT, 4],
            &[CPU_LIMIT, 101],
            &[CPU_LIMIT, 50, 0],
        ] {
            assert!(ControlEntry::decode(bad).is_err(), "{bad:?}");
        }
    }
}
