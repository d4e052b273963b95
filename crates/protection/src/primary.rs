//! The side that runs the VM, as the live loop sees it: one interface
//! that recording to a file (`record`), lockstep (`lockstep`), epochs
//! (`epoch`) and checkpoints (`checkpoint`) implement, so the loop holds
//! one `Option<Box<dyn Primary<E>>>` and knows no mode by name.
//!
//! It is generic over the VM's engine, and each mode asks of the engine
//! only what it needs: checkpoints take any [`Engine`]; recording,
//! lockstep and epochs take a [`DeterministicEngine`] (exact instruction
//! counts), so a mode that needs determinism cannot be set over an engine
//! without it.
//!
//! The loop's turn, and where each method comes in:
//!
//! ```text
//! before_run ─ run the machine to run_target ─ after_run (inputs due now)
//!   ─ gate (its requests) ─ after_slice (pause, checkpoint) ─ host events
//!   ─ input, for each input while accepts_inputs ─ (idle: before_sleep,
//!   wake_within) ─ again
//! ```
//!
//! When the peer is declared failed the loop calls `peer_lost`: the side
//! either wins the arbiter and hands back what it held (the VM runs on
//! alone, without it), or reports that the peer went live and this side
//! must halt, releasing nothing. When the VM ends, `end` says what may
//! still leave, and `finish` closes the stream once the host has drained.

use crate::error::{Deposed, ProtectionError};
use crate::events::{Events, PairEvent};
use crate::status::PairStatus;
#[cfg(doc)]
use ftvm_machine::DeterministicEngine;
use ftvm_machine::{Engine, Event, IoRequest, RunExit};
use ftvm_replication::arbiter::{Arbiter, Verdict};
use ftvm_replication::channel::Failure;
use ftvm_replication::fence::Fence;
use std::time::{Duration, Instant};

/// A request of the machine to the host, with its virtio slot.
pub type Request = (usize, IoRequest);

/// What a primary that won the arbiter after its backup failed hands
/// back to the loop, which runs on without it.
#[derive(Default)]
pub struct Alone {
    /// Outputs it held for the backup's acknowledgement: they go now.
    pub outputs: Vec<Request>,
    /// Inputs it held for a point of delivery (an epoch's end): they go in now.
    pub inputs: Vec<Event>,
}

/// The side that runs the VM, on an engine of type `E`.
pub trait Primary<E: Engine> {
    /// Where the next run of the machine stops, given where the loop
    /// would next look at the host (`look_at`).
    fn run_target(&self, _icount: u64, look_at: u64) -> u64 {
        look_at
    }

    /// Before the machine runs on (also while paused): close what the
    /// stream owes for the instructions run so far.
    fn before_run(&mut self, m: &mut E, paused: bool) -> Result<(), ProtectionError>;

    /// After a run that stopped with `exit`: the inputs to deliver now,
    /// which waited for this point.
    fn after_run(&mut self, _m: &E, _exit: &RunExit) -> Vec<Event> {
        Vec::new()
    }

    /// Whether inputs may be delivered where the machine stands now.
    fn accepts_inputs(&self) -> bool {
        true
    }

    /// An input, at instruction `icount`: returned to be delivered now
    /// (and logged), or kept until the machine stands where inputs may
    /// be delivered.
    fn input(&mut self, icount: u64, ev: Event) -> Option<Event>;

    /// The machine's new requests, made by instruction `icount`: those
    /// that may go to the host now, with any earlier outputs that may go
    /// now; outputs that must wait are kept.
    fn gate(&mut self, requests: Vec<Request>, icount: u64) -> Vec<Request>;

    /// After a run of `busy` host time (`idle`: every hart waits for an
    /// interrupt): a checkpoint when one is due, and how long the VM
    /// pauses to keep the backup near (tell [`Primary::paused`]).
    fn after_slice(&mut self, m: &mut E, busy: Duration, idle: bool) -> Result<Duration, ProtectionError>;

    /// The VM paused for `slept` as [`Primary::after_slice`] asked.
    fn paused(&mut self, _slept: Duration) {}

    /// While the guest sleeps: how soon the loop must wake to show the
    /// backup this side is alive (None: it need not).
    fn wake_within(&self, _now: Instant) -> Option<Duration> {
        None
    }

    /// The guest goes to sleep: nothing more will come to batch the
    /// stream with.
    fn before_sleep(&mut self) {}

    /// Whether the VM may be paused (a protected VM may not: its backup
    /// would take the silence for a failure and go live).
    fn may_pause(&self) -> bool;

    /// The peer is declared failed: win the arbiter and hand back what
    /// was held, or an error (halt) because the peer went live first.
    fn peer_lost(&mut self, failure: &Failure) -> Result<Alone, ProtectionError>;

    /// Its part of the VM's status (None: it is in no pair).
    fn status(&mut self) -> Option<PairStatus>;

    /// What the run did, for the last words (None: nothing to say).
    fn summary(&self) -> Option<String> {
        None
    }

    /// The VM ends (`status`: the guest's exit status when it powered
    /// off): what may still leave before the host drains.
    fn end(&mut self, _m: &mut E, _status: Option<u32>) -> Vec<Request> {
        Vec::new()
    }

    /// After the host drained: closes the stream.
    fn finish(self: Box<Self>, m: &mut E, status: Option<u32>) -> Result<(), ProtectionError>;
}

/// A primary's backup is declared failed: the test-and-set at the arbiter
/// (VMware FT §2.3). On winning, `held()` gives up what the primary held
/// for the backup and it runs on alone with it; on losing, an error: the
/// backup went live first and this side must halt. `me` names this host
/// in the arbiter's record.
pub fn backup_lost(
    arbiter: &Arbiter,
    me: &str,
    failure: &Failure,
    events: &Events,
    fence: &Fence,
    held: impl FnOnce() -> Vec<Request>,
) -> Result<Vec<Request>, ProtectionError> {
    eprintln!("ftvm: the backup is declared failed: {failure}");
    events.emit(PairEvent::DeclaredFailed { who: "backup".into(), reason: failure.to_string() });
    let generation = arbiter.generation();
    match arbiter.go_live(me, |n| events.arbiter_note(n)) {
        Verdict::Won => {
            // Alone from here: the held outputs, and all after, may go.
            fence.won();
            events.emit(PairEvent::ArbiterWon { generation });
            let out = held();
            eprintln!(
                "ftvm: won generation {generation} at the arbiter; running unprotected, {} held outputs released",
                out.len()
            );
            events.emit(PairEvent::Unprotected { released: out.len() as u64 });
            Ok(out)
        }
        Verdict::Lost(who) => {
            // Before anything else: nothing more leaves this side, from
            // any thread.
            fence.deposed();
            events.emit(PairEvent::ArbiterLost { generation, winner: who.clone() });
            let deposed = Deposed { who, generation };
            events.emit(PairEvent::Halting { reason: deposed.to_string() });
            Err(deposed.into())
        }
    }
}
