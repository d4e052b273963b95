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
//! ```

use crate::error::PeerError;
use std::time::Duration;

const TIMEOUT: u8 = 1;

/// The timeouts a pair may be given, in milliseconds: under 20 ms a
/// host's scheduling alone would be taken for a failure; a minute is
/// longer than anyone waits for a failover.
pub const TIMEOUT_RANGE_MS: std::ops::RangeInclusive<u64> = 20..=60_000;

/// A change the backup makes because the primary made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlEntry {
    /// Declare the other side failed after this much silence (both sides:
    /// the primary takes it first, the backup as it reads it).
    Timeout(Duration),
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
        }
    }

    /// An entry from the stream; what is not one (an unknown kind, a
    /// timeout out of range) is a stream the backup cannot follow.
    pub fn decode(bytes: &[u8]) -> Result<ControlEntry, PeerError> {
        match bytes {
            [TIMEOUT, ms @ ..] if ms.len() == 4 => {
                let ms = u32::from_le_bytes(ms.try_into().expect("4 bytes")) as u64;
                if !TIMEOUT_RANGE_MS.contains(&ms) {
                    return Err(PeerError::Control(format!("a failure timeout of {ms} ms")));
                }
                Ok(ControlEntry::Timeout(Duration::from_millis(ms)))
            }
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
        let e = ControlEntry::Timeout(Duration::from_millis(1500));
        assert_eq!(ControlEntry::decode(&e.encode()).unwrap(), e);
        for bad in
            [&[][..], &[9, 0, 0, 0, 0], &[TIMEOUT, 1, 0], &[TIMEOUT, 5, 0, 0, 0], &[TIMEOUT, 0xff, 0xff, 0xff, 0xff]]
        {
            assert!(ControlEntry::decode(bad).is_err(), "{bad:?}");
        }
    }
}
