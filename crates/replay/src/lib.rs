//! The replay log: every input a VM received from outside, at the exact
//! instruction count where it took effect, so that a machine started from
//! the same state and fed the same entries reaches the same states
//! (VMware FT §2.1; the tech report's §2.4 "go-live points").
//!
//! - [`codec`]: how one entry is encoded (an instruction-count delta as a
//!   varint, a kind byte, a payload).
//! - [`log`]: the stream around entries: a versioned header naming the
//!   machine and its starting state, then checksummed frames, each ending at
//!   a go-live point. A reader hands out only whole frames, so a log cut or
//!   damaged anywhere still replays to its last go-live point, and the error
//!   names the byte offset and instruction count where it stopped.
//!
//! - [`recorder`]: a running VM's inputs written to a log as they come.
//! - [`replayer`]: a machine rebuilt from a log's header and driven by its
//!   records, with no host I/O.
//!
//! The same writer serves a file (`ftvm record`) and any byte stream (the
//! logging channel of the lockstep mode).

pub mod codec;
pub mod log;
pub mod recorder;
pub mod replayer;
pub mod waiting;

pub use codec::{DecodeError, Entry, Record};
pub use log::{Header, LogError, LogErrorKind, LogReader, LogWriter};
