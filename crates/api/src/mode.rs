//! The choices a pair is made with, as one type each wherever they go
//! (a command line's option, a configuration file, the control socket's
//! `protect`, the cluster's records and API): the mode that keeps the
//! backup in step, where the disks live, and the epoch protocol. Each is
//! written as its lowercase name (`checkpoint`, `separate`, `revised`),
//! in JSON and on a command line alike.

use serde::{Deserialize, Serialize};

/// How the backup is kept in step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// VMware FT: each input is logged at the instruction where it arrives.
    Lockstep,
    /// Bressoud & Schneider: inputs wait for the end of an epoch of
    /// --epoch-length instructions.
    Epoch,
    /// Remus: the backup does not execute; whole-VM checkpoints every
    /// --interval, outputs held until their checkpoint is acknowledged.
    Checkpoint,
}

/// Where the VM's disks live (VMware FT §4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiskSharing {
    /// One disk on the shared storage, written by the primary alone
    /// under the Output Rule.
    Shared,
    /// Each host has its own copy, identical when protection starts; the
    /// backup performs the writes on its own.
    Separate,
}

/// Whether the primary waits for acknowledgements at every epoch end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EpochProtocol {
    /// P2 as first published: wait at every epoch end; outputs then leave
    /// at once.
    Original,
    /// §4.3: no wait at epoch ends; an output waits for the
    /// acknowledgement of everything sent before it.
    Revised,
}

/// A name that is none of a choice's: what was given and what may be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{given:?} is not {what} ({})", .allowed.join(", "))]
pub struct UnknownName {
    /// What the choice is ("a mode").
    pub what: &'static str,
    /// The name given.
    pub given: String,
    /// The names there are.
    pub allowed: &'static [&'static str],
}

/// The lowercase names of a choice, both ways, in one table: `name`,
/// `FromStr`, `Display` and the list of names a refusal quotes.
macro_rules! named {
    ($type:ident, $what:literal, $($variant:ident => $name:literal),+) => {
        impl $type {
            /// Every name, in order.
            pub const NAMES: &'static [&'static str] = &[$($name),+];

            /// The name the command line, JSON and status use.
            pub fn name(self) -> &'static str {
                match self {
                    $($type::$variant => $name),+
                }
            }
        }

        impl std::str::FromStr for $type {
            type Err = $crate::mode::UnknownName;

            fn from_str(text: &str) -> Result<Self, $crate::mode::UnknownName> {
                match text {
                    $($name => Ok($type::$variant),)+
                    _ => Err($crate::mode::UnknownName { what: $what, given: text.to_string(), allowed: $type::NAMES }),
                }
            }
        }

        impl std::fmt::Display for $type {
            fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

pub(crate) use named;

named!(Mode, "a mode", Lockstep => "lockstep", Epoch => "epoch", Checkpoint => "checkpoint");
named!(DiskSharing, "a disk sharing", Shared => "shared", Separate => "separate");
named!(EpochProtocol, "an epoch protocol", Original => "original", Revised => "revised");

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are the JSON's: a record stored before the mode was a
    /// type (the cluster's `"protect": "checkpoint"`) reads the same.
    #[test]
    fn names_are_the_json_strings_both_ways() {
        for mode in [Mode::Lockstep, Mode::Epoch, Mode::Checkpoint] {
            let json = serde_json::to_string(&mode).unwrap();
            assert_eq!(json, format!("\"{mode}\""));
            assert_eq!(serde_json::from_str::<Mode>(&json).unwrap(), mode);
            assert_eq!(mode.name().parse::<Mode>().unwrap(), mode);
        }
        assert_eq!(serde_json::to_string(&DiskSharing::Separate).unwrap(), r#""separate""#);
        assert_eq!(serde_json::to_string(&EpochProtocol::Revised).unwrap(), r#""revised""#);
        let e = "checkpoint --bogus".parse::<Mode>().unwrap_err().to_string();
        assert_eq!(e, r#""checkpoint --bogus" is not a mode (lockstep, epoch, checkpoint)"#);
    }
}
