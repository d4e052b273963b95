#![deny(missing_docs)]

//! Fault tolerance for a VM, apart from any host or front end: the three
//! designs ftvm implements (VMware FT's lockstep, Bressoud & Schneider's
//! epochs, Remus's checkpoints), each as its two sides, behind one
//! interface for the side that runs the VM ([`primary::Primary`]).
//!
//! - [`pair`]: what the two sides agree on (mode, disks, generation) and
//!   the versioned handshake header that carries it.
//! - [`primary`]: the interface the host's live loop drives, and the
//!   test-and-set every mode does when its backup is lost.
//! - [`lockstep`], [`epoch`], [`checkpoint`]: each mode's sides.
//! - [`control`]: the control entries a primary sends its backup in
//!   the stream (a new failure timeout).
//! - [`resend`]: the TCP segments a replaying backup sends again when it
//!   goes live, so a client waits for no retransmission timer.
//! - [`transfer`]: a running VM's machine sent to its new backup while
//!   the guest runs (pre-copy, then a final pause), before its pair starts.
//! - [`local`]: the disks and files a backup's own host gives a pair:
//!   nothing a backup touches is named by the wire.
//! - [`error`]: why a side cannot go on, by where the fault lies.
//! - [`status`]: what each side reports of itself, as serde types;
//!   [`events`]: what happens to it, as typed events.
//!
//! The machine-agnostic policies these are made of (the logging channel,
//! heartbeats, the arbiter, the Output Rule, lag control, the checkpoint
//! stream) are `ftvm_replication`'s; the replay log and its engines are
//! `ftvm_replay`'s. Nothing here parses a command line. The types a
//! client reads (the modes, status, events, the limits of a setting) are
//! `ftvm_api`'s, used here under their old paths.

pub mod backup;
pub mod checkpoint;
pub mod control;
pub mod epoch;
pub mod error;
pub mod events;
pub mod local;
pub mod lockstep;
pub mod pair;
pub mod primary;
pub mod resend;
/// What each side reports of itself (`ftvm_api::status`).
pub mod status {
    pub use ftvm_api::status::*;
}
pub mod transfer;
