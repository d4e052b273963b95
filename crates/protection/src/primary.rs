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

use crate::control::ControlEntry;
use crate::error::{Deposed, ProtectionError};
use crate::events::{Events, PairEvent};
use crate::status::PairStatus;
#[cfg(doc)]
use ftvm_machine::DeterministicEngine;
use ftvm_machine::{Engine, Event, IoRequest, RunExit};
use ftvm_replication::arbiter::{Arbiter, Verdict};
use ftvm_replication::channel::{Failure, SenderWatch};
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

/// How a planned handover ended.
pub enum HandOver {
    /// The backup claimed the VM at the arbiter: this side stops, and
    /// nothing more leaves it.
    Done {
        /// The generation the backup won.
        generation: u64,
    },
    /// The backup failed before it claimed the VM: this side won the
    /// arbiter itself and runs on alone, with what it held.
    Kept(Alone),
}

/// What a running VM's transfer to its new backup took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transferred {
    /// The pair's generation at the arbiter.
    pub generation: u64,
    /// Pre-copy rounds.
    pub rounds: u32,
    /// Pages sent in all, and in the final pause.
    pub pages: u64,
    /// Of them, in the final pause.
    pub final_pages: u64,
    /// Bytes of stream.
    pub bytes: u64,
    /// The final pause's length (the loop adds its own part, the I/O
    /// it let finish first).
    pub pause: Duration,
    /// From the start of the pre-copy to the end of the final pause.
    pub total: Duration,
}

impl Transferred {
    /// The figures the pair's event and the protect's reply say.
    pub fn figures(&self) -> ftvm_api::events::TransferFigures {
        ftvm_api::events::TransferFigures {
            rounds: self.rounds,
            pages: self.pages,
            final_pages: self.final_pages,
            bytes: self.bytes,
            pause_ms: self.pause.as_millis() as u64,
            total_ms: self.total.as_millis() as u64,
        }
    }
}

/// How long a handover waits for the backup at each of its steps: to
/// acknowledge the log that produced the held outputs, and to claim the
/// VM once it has the handover (it replays its lag first, at most about
/// the lag threshold).
pub const HAND_OVER_WAIT: Duration = Duration::from_secs(10);

/// The side that runs the VM, on an engine of type `E`.
pub trait Primary<E: Engine> {
    /// Where the next run of the machine stops, given where the loop
    /// would next look at the host (`look_at`).
    fn run_target(&self, _icount: u64, look_at: u64) -> u64 {
        look_at
    }

    /// Whether the machine must run deterministically (its harts in the
    /// exact round-robin on one thread) for this side: a log replayed by
    /// a backup needs it; checkpoints, which carry the state itself, do
    /// not, and let the harts run in parallel.
    fn needs_determinism(&self) -> bool {
        true
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

    /// A planned handover (a switchover), first step: the loop stopped
    /// the machine where inputs may be delivered, before
    /// [`Primary::before_run`] closed what the stream owes there (the
    /// handover's mark closes it instead), and runs it no more unless
    /// the handover fails. Waits (up to [`HAND_OVER_WAIT`]) until the backup
    /// holds everything that produced the outputs held here, and returns
    /// them: they go, and the host drains, before the backup may go live.
    fn hand_over(&mut self, _m: &mut E) -> Result<Vec<Request>, ProtectionError> {
        Err(ProtectionError::NoBackupToHandOver)
    }

    /// Second step, after the host drained: the stream ends with the
    /// handover, and this side waits for the backup to claim the VM at
    /// the arbiter. An error: the backup did not catch up in time, nothing
    /// was handed over, and the pair runs on.
    fn hand_over_end(&mut self, _m: &mut E) -> Result<HandOver, ProtectionError> {
        Err(ProtectionError::NoBackupToHandOver)
    }

    /// Whether this side is only the way to another: a running VM's
    /// transfer to its new backup, ready for its final pause. The loop
    /// then stops the machine, lets the host's I/O finish and applies
    /// what came back (nothing may be in flight), and calls
    /// [`Primary::succeed`].
    fn successor_due(&self) -> bool {
        false
    }

    /// The final pause of a transfer ([`Primary::successor_due`]): the
    /// machine stopped with no I/O in flight. Once the new backup holds
    /// the machine, `before_start` ends what the new pair replaces (a
    /// moved backup's old pair; its error, a lost arbiter, is returned
    /// and the side halts); then the pair starts. Returns the side that
    /// goes on from here, and what the transfer took; any other error
    /// leaves the VM as it was before the transfer.
    fn succeed(
        self: Box<Self>,
        _m: &mut E,
        _before_start: &mut dyn FnMut(&mut E) -> Result<(), ProtectionError>,
    ) -> Result<(Box<dyn Primary<E>>, Transferred), ProtectionError> {
        Err(ProtectionError::NoTransfer)
    }

    /// Whether this side's stream to its backup has failed (so a backup
    /// declared failed is this side's, not another transfer's).
    fn stream_failed(&self) -> bool {
        false
    }

    /// Protection stops on purpose (`unprotect`), the machine stopped
    /// where inputs may be delivered: the stream ends as at the VM's end
    /// (the backup stops following), and what was held is handed back
    /// for the VM to run on alone. A backup that did not acknowledge the
    /// end may yet take the silence for a failure: this side then goes
    /// to the arbiter as for a lost backup (an error: it lost, and halts).
    fn unprotect(self: Box<Self>, _m: &mut E) -> Result<Alone, ProtectionError> {
        Err(ProtectionError::NoBackupToHandOver)
    }

    /// An operation on this side that the backup must follow (a new
    /// failure timeout, a CPU limit): this side makes the change now and sends it to
    /// the backup as a control entry in the stream, which takes it when
    /// it reads it.
    fn control(&mut self, _m: &mut E, _entry: ControlEntry) -> Result<(), ProtectionError> {
        Err(ProtectionError::NoBackupToControl)
    }

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

/// Protection ended on purpose ([`Primary::unprotect`]), the stream's end
/// `acknowledged` or not: what was held (`held()`) goes, once the backup
/// has stopped (it acknowledged) or the arbiter says this side is alone.
pub fn protection_stopped(
    acknowledged: bool,
    arbiter: &Arbiter,
    me: &str,
    events: &Events,
    fence: &Fence,
    held: impl FnOnce() -> Vec<Request>,
) -> Result<Vec<Request>, ProtectionError> {
    if !acknowledged {
        let silent = Failure::ChannelSilent(END_ACK_WAIT);
        eprintln!("ftvm: the backup did not acknowledge the end of protection: it may take over");
        return backup_lost(arbiter, me, &silent, events, fence, held);
    }
    fence.end_lease();
    let out = held();
    eprintln!(
        "ftvm: protection stopped: the backup stopped following; running unprotected, {} held outputs released",
        out.len()
    );
    events.emit(PairEvent::ProtectionStopped { released: out.len() as u64 });
    Ok(out)
}

/// How long a primary ending its stream (the VM's end, `unprotect`) waits
/// for the backup to acknowledge the end.
pub const END_ACK_WAIT: Duration = Duration::from_secs(5);

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
    // This side's own earlier claim (after a handover that failed)
    // counts as won: the record names this very process.
    let verdict = match arbiter.go_live(me, |n| events.arbiter_note(n)) {
        Verdict::Lost(who) if who == me => Verdict::Won,
        v => v,
    };
    match verdict {
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

/// After the stream ended with a handover (`mark_sent`; false when the
/// channel failed before it could be): waits for the backup to claim
/// the pair's generation at the arbiter (this side stops). A backup that
/// has the mark closes the channel and claims at once, so a closed
/// channel is given [`CLAIM_GRACE`] before this side contends itself; a
/// backup that neither claims nor fails is given [`HAND_OVER_WAIT`].
/// Contending, this side either wins and runs on alone with what it held
/// (`held`), or loses: the backup has the VM. `since`: when the guest
/// stopped, for the event.
#[allow(clippy::too_many_arguments)]
pub fn await_claim(
    arbiter: &Arbiter,
    me: &str,
    events: &Events,
    fence: &Fence,
    mark_sent: bool,
    failure: impl Fn() -> Option<Failure>,
    held: impl FnOnce() -> Vec<Request>,
    since: Instant,
) -> Result<HandOver, ProtectionError> {
    let generation = arbiter.generation();
    let waited = Instant::now();
    let mut failed: Option<(Instant, Failure)> = None;
    let done = |fence: &Fence| {
        // Nothing more leaves this side, from any thread.
        fence.deposed();
        events.emit(PairEvent::HandedOver { generation, millis: since.elapsed().as_millis() as u64 });
        Ok(HandOver::Done { generation })
    };
    loop {
        // The claim is looked at before the channel: a backup that took
        // the mark closes it, and claims.
        if arbiter.winner().is_some_and(|w| w != me) {
            return done(fence);
        }
        if failed.is_none() {
            failed = failure().map(|f| (Instant::now(), f));
        }
        let give_up = match &failed {
            Some((at, _)) => !mark_sent || at.elapsed() >= CLAIM_GRACE,
            None => waited.elapsed() >= HAND_OVER_WAIT,
        };
        if give_up {
            let reason = match &failed {
                Some((_, f)) => format!("the backup failed during the handover: {f}"),
                None => format!("the backup did not take the VM over within {} s", HAND_OVER_WAIT.as_secs()),
            };
            return match arbiter.go_live(me, |n| events.arbiter_note(n)) {
                Verdict::Won => {
                    fence.won();
                    events.emit(PairEvent::ArbiterWon { generation });
                    eprintln!("ftvm: {reason}; won generation {generation} at the arbiter, running on unprotected");
                    events.emit(PairEvent::HandOverFailed { reason });
                    let outputs = held();
                    events.emit(PairEvent::Unprotected { released: outputs.len() as u64 });
                    Ok(HandOver::Kept(Alone { outputs, inputs: Vec::new() }))
                }
                Verdict::Lost(_) => done(fence),
            };
        }
        std::thread::sleep(CLAIM_POLL);
    }
}

/// How often a primary that handed over looks for the backup's claim.
const CLAIM_POLL: Duration = Duration::from_millis(1);

/// How long a primary whose channel closed after it sent the handover
/// mark waits for the backup's claim before contending itself: the
/// backup closes the channel as it goes to claim, a file created on the
/// shared storage within milliseconds; a backup that died instead costs
/// the VM this long.
pub const CLAIM_GRACE: Duration = Duration::from_secs(2);

/// What a primary does on its own side for a control entry before it
/// sends it: the change that concerns its channel and heartbeats. (A CPU
/// limit concerns the VM: the host loop that paces it has taken it.)
pub fn apply_control(channel: &SenderWatch, entry: ControlEntry, events: &Events) {
    match entry {
        ControlEntry::Timeout(timeout) => {
            channel.set_timeout(timeout);
            eprintln!("ftvm: the pair's failure timeout is {} ms (sent to the backup)", timeout.as_millis());
            events.emit(PairEvent::TimeoutChanged { timeout_ms: timeout.as_millis() as u64 });
        }
        ControlEntry::CpuLimit(percent) => {
            eprintln!("ftvm: the VM's CPU limit is {percent} % of a host core (sent to the backup)");
            events.emit(PairEvent::CpuLimitChanged { percent });
        }
    }
}
