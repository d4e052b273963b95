//! Protecting a running VM (VMware FT §3.1, "FT VMotion"; Remus §2.2
//! starts the same way): the machine goes to the new backup while the
//! guest runs on, and the pair starts after a short final pause.
//!
//! The transfer rides the stream of the pair it starts, after the
//! header (whose start is `streamed`), as checkpoint 0 of the checkpoint
//! stream: pre-copy rounds of pages (`Record::Pages` of checkpoint 0,
//! sent by the checkpoint sender thread while the guest runs), then, in
//! the final pause, checkpoint 0 itself: the pages written since the
//! last round and the machine's state, with no I/O in flight (the loop
//! let it finish). Round 1 is every page of RAM in use; each later round
//! is the pages written while the one before went out. When a round is
//! small enough (or after [`MAX_ROUNDS`]), it goes as the last, the
//! transfer waits for the sender to have written it, and asks for the
//! final pause.
//!
//! From checkpoint 0 the pair is what it would have been from a boot:
//! checkpoint mode's checkpointer goes on with checkpoint 1 on the same
//! sender; lockstep and epochs take the channel over for the replay log,
//! whose first frame starts where the pause stopped the machine. The
//! backup holds nothing it could go live with until checkpoint 0 is
//! whole, so until then the VM runs unprotected, outputs released as
//! they come, and a failed backup only ends the attempt.
//!
//! Separate disks (every mode) are made the same beside it. The loop
//! lets the writes already issued land before the transfer sees its
//! first request; from then on every write goes into the stream too (to
//! apply with checkpoint 0), and the sender hashes this host's disks and
//! sends the blocks that differ from the backup's copies (whose digests
//! it asked with). A block read while the guest writes it may be old or
//! new: the write's record, applied after, makes it new. From checkpoint
//! 0 on the copies are the same, and the pair keeps them so as it would
//! from a boot (a replay backup performs the log's writes on its copy).

use crate::checkpoint::primary::Checkpointer;
use crate::epoch::primary::Epoch;
use crate::epoch::EpochMode;
use crate::error::ProtectionError;
use crate::events::{Events, PairEvent};
use crate::lockstep::primary::Lockstep;
use crate::pair::Mode;
use crate::pair::{DiskPolicy, SlotDisks};
use crate::primary::{Alone, Primary, Request, Transferred};
use crate::status::{PairStatus, PrimaryMode, PrimaryStatus, TransferStatus};
use ftvm_machine::{DeterministicEngine, Engine, Event, RunExit};
use ftvm_replay::recorder::Recorder;
use ftvm_replication::channel::Failure;
use ftvm_replication::page_delta::PAGE_SIZE;
use std::time::{Duration, Instant};

/// Pages handed to the sender at once (8 MiB): a copy of a few
/// milliseconds between two slices of the guest.
const SHARE: usize = 2048;
/// A round this small goes as the last: the pages written while it goes
/// out are few enough for the final pause (16 MiB at most).
const LAST_ROUND: usize = 4096;
/// Rounds after which the transfer ends whatever the guest writes: a
/// guest that writes faster than the channel carries would never let it
/// converge (the final pause then carries what the last round left).
pub const MAX_ROUNDS: u32 = 30;
/// How long the final pause waits for the backup to acknowledge
/// checkpoint 0 before the attempt fails (the guest stands still
/// meanwhile: the channel carries a few MiB at most by then).
const START_WAIT: Duration = Duration::from_secs(5);

/// What the pair is once the machine is across.
pub enum Then {
    /// Lockstep, or epochs when given: the replay log takes the channel
    /// over after checkpoint 0.
    Log {
        /// The execution lag past which the primary is slowed.
        lag_threshold: Duration,
        /// What the pair does about disks.
        disks: DiskPolicy,
        /// Epochs, if the pair runs in epoch mode.
        epoch: Option<EpochMode>,
        /// How often a frame goes out while the guest runs.
        go_live_every: Duration,
    },
    /// Checkpoints: the checkpointer that sent the transfer goes on.
    Checkpoints,
}

/// A running VM's disks of which the backup keeps copies of its own
/// (separate disks), made the same while the guest writes.
pub struct DiskCopies {
    /// This host's disks (slot, path).
    pub disks: SlotDisks,
    /// The backup's requests: the digests of its copies.
    pub requests: Vec<Vec<u8>>,
}

impl Then {
    /// The mode the pair will run in.
    pub fn mode(&self) -> Mode {
        match self {
            Then::Log { epoch: Some(_), .. } => Mode::Epoch,
            Then::Log { epoch: None, .. } => Mode::Lockstep,
            Then::Checkpoints => Mode::Checkpoint,
        }
    }
}

/// A running VM's transfer to its new backup: the primary's side until
/// the pair starts.
pub struct Transfer {
    sender: Checkpointer,
    then: Then,
    /// Separate disks, until their sync starts with the pre-copy.
    copies: Option<DiskCopies>,
    /// Whether the guest's writes go into the stream (separate disks).
    mirror_writes: bool,
    me: String,
    events: Events,
    /// When the pre-copy began (the first slice after this was made).
    started: Option<Instant>,
    round: u32,
    /// The pages of this round not handed to the sender yet, the next last.
    todo: Vec<u64>,
    /// Whether the last round has been handed over.
    last_round: bool,
    pages: u64,
    /// The stream's size when the transfer began.
    bytes_before: u64,
    /// Whether the machine stands where the pair may start (epochs: an
    /// epoch end, where the backup's rule lets inputs in).
    at_boundary: bool,
}

impl Transfer {
    /// A transfer over `sender`, the checkpoint sender on the pair's
    /// channel (its header acknowledged: the backup can follow), and
    /// with separate disks, the `copies` made the same beside it.
    pub fn new(sender: Checkpointer, then: Then, copies: Option<DiskCopies>, me: String, events: Events) -> Transfer {
        let (bytes_before, _) = sender.stream_bytes();
        Transfer {
            sender,
            then,
            mirror_writes: copies.is_some(),
            copies,
            me,
            events,
            started: None,
            round: 0,
            todo: Vec::new(),
            last_round: false,
            pages: 0,
            bytes_before,
            at_boundary: true,
        }
    }

    /// Between two slices of the guest: hands the sender the next share
    /// of the round when it has room, and starts the next round when one
    /// is done.
    fn step(&mut self, m: &mut dyn Engine) {
        if self.started.is_none() {
            self.started = Some(Instant::now());
            if let Some(DiskCopies { disks, requests }) = self.copies.take() {
                // The guest's writes go into the stream from the first
                // request this side's gate saw, and the loop let those
                // before land: the disks can be read while it writes.
                self.sender.sync_disks(requests, disks);
            }
            // From here on every page written is sent again: a view of
            // its own, as the pair in force (a moving backup's) takes the
            // pages written for its checkpoints or state digests.
            self.sender.begin_precopy(m);
            let base = m.ram().base() / PAGE_SIZE as u64;
            let pages = m.ram().size() / PAGE_SIZE as u64;
            self.todo = (base..base + pages).rev().collect();
            self.round = 1;
        }
        if self.todo.is_empty() {
            if self.last_round {
                return;
            }
            let mut dirty = m.take_dirty_view();
            self.last_round = dirty.len() <= LAST_ROUND || self.round >= MAX_ROUNDS;
            self.round += 1;
            dirty.reverse();
            self.todo = dirty;
        }
        let n = self.todo.len().min(SHARE);
        let at = self.todo.len() - n;
        let mut share: Vec<u64> = self.todo[at..].iter().rev().copied().collect();
        if self.round == 1 {
            // The backup's copy of RAM starts zeroed.
            let ram = m.ram();
            let base = ram.base() / PAGE_SIZE as u64;
            let bytes = ram.as_slice();
            share.retain(|&pfn| {
                let off = (pfn - base) as usize * PAGE_SIZE;
                bytes[off..off + PAGE_SIZE].iter().any(|&b| b != 0)
            });
        }
        if share.is_empty() || self.sender.precopy(m, &share) {
            self.todo.truncate(at);
            self.pages += share.len() as u64;
        }
    }

    fn transfer_status(&self) -> PairStatus {
        let (bytes, acked) = self.sender.stream_bytes();
        PairStatus::Primary(PrimaryStatus::of(
            self.sender.watch(),
            self.sender.generation(),
            PrimaryMode::Transfer(TransferStatus {
                then: self.then.mode(),
                round: self.round,
                round_left: self.todo.len() as u64,
                pages: self.pages,
                bytes: bytes - self.bytes_before,
                acked: acked.saturating_sub(self.bytes_before),
            }),
        ))
    }
}

impl<E: DeterministicEngine> Primary<E> for Transfer {
    /// Epochs start at an epoch end: once the final pause is due, the
    /// machine runs to the next one.
    fn run_target(&self, icount: u64, look_at: u64) -> u64 {
        match &self.then {
            Then::Log { epoch: Some(mode), .. } if self.last_round && self.todo.is_empty() => {
                mode.next_end(icount).min(look_at)
            }
            _ => look_at,
        }
    }

    fn before_run(&mut self, _m: &mut E, _paused: bool) -> Result<(), ProtectionError> {
        Ok(())
    }

    fn after_run(&mut self, m: &E, exit: &RunExit) -> Vec<Event> {
        self.at_boundary = match &self.then {
            Then::Log { epoch: Some(mode), .. } => mode.is_end(m.icount(), exit),
            _ => true,
        };
        Vec::new()
    }

    fn input(&mut self, _icount: u64, ev: Event) -> Option<Event> {
        Some(ev)
    }

    /// Nothing is protected yet: everything goes out as it comes. Disk
    /// writes go into the stream too where the backup keeps its own copy.
    fn gate(&mut self, requests: Vec<Request>, _icount: u64) -> Vec<Request> {
        if self.mirror_writes {
            self.sender.mirror_writes(&requests);
        }
        requests
    }

    fn after_slice(&mut self, m: &mut E, _busy: Duration, _idle: bool) -> Result<Duration, ProtectionError> {
        if !self.sender.failed() {
            self.step(m);
        }
        Ok(Duration::ZERO)
    }

    /// A transfer goes on while the guest sleeps.
    fn wake_within(&self, _now: Instant) -> Option<Duration> {
        (!(self.last_round && self.todo.is_empty())).then_some(Duration::from_millis(1))
    }

    fn may_pause(&self) -> bool {
        false
    }

    /// The backup cannot go live before checkpoint 0: its loss only ends
    /// the attempt, and the VM runs on as it did.
    fn peer_lost(&mut self, failure: &Failure) -> Result<Alone, ProtectionError> {
        let reason = format!("the new backup failed during the transfer: {failure}");
        eprintln!("ftvm: {reason}; the VM runs on unprotected");
        self.events.emit(PairEvent::ProtectionFailed { reason });
        Ok(Alone::default())
    }

    /// Nothing is protected yet: the backup, cut off before checkpoint
    /// 0, has nothing to go live with.
    fn unprotect(self: Box<Self>, _m: &mut E) -> Result<Alone, ProtectionError> {
        self.events.emit(PairEvent::ProtectionFailed { reason: "stopped (unprotect) during the transfer".into() });
        Ok(Alone::default())
    }

    fn successor_due(&self) -> bool {
        self.last_round && self.todo.is_empty() && self.at_boundary && self.sender.precopy_done()
    }

    fn stream_failed(&self) -> bool {
        self.sender.failed()
    }

    fn succeed(
        self: Box<Self>,
        m: &mut E,
        before_start: &mut dyn FnMut(&mut E) -> Result<(), ProtectionError>,
    ) -> Result<(Box<dyn Primary<E>>, Transferred), ProtectionError> {
        let t0 = Instant::now();
        let Transfer { mut sender, then, me, events, started, round, pages, bytes_before, .. } = *self;
        // Checkpoint 0 carries the pages written since the last round
        // was taken, and the machine's state.
        let final_pages = sender.checkpoint(m)? as u64;
        // The pair starts (its backup may go live) once the backup holds
        // checkpoint 0; until then a failure of either side leaves the VM
        // where it is, unprotected.
        let not_acked = ProtectionError::TransferNotAcknowledged(START_WAIT);
        let generation = sender.generation();
        let fence = sender.fence();
        let backup = sender.watch().peer().to_string();
        let mode = then.mode();
        let (successor, bytes): (Box<dyn Primary<E>>, u64) = match then {
            Then::Checkpoints => {
                if !sender.wait_checkpoint_acked(0, START_WAIT) {
                    return Err(not_acked);
                }
                before_start(m)?;
                // Checkpoint 1 carries what is written from here on.
                let _ = m.take_dirty_pages();
                sender.mark_started()?;
                let bytes = sender.stream_bytes().0 - bytes_before;
                (Box::new(sender), bytes)
            }
            Then::Log { lag_threshold, disks, epoch, go_live_every } => {
                let (channel, arbiter) = sender.into_channel()?;
                if !channel.wait_acked(channel.written(), START_WAIT) {
                    return Err(not_acked);
                }
                before_start(m)?;
                // The first state digest hashes what is written from here
                // on, as on the backup's machine, restored just now.
                let _ = m.take_dirty_pages();
                arbiter.mark_started()?;
                let bytes = channel.written() - bytes_before;
                // Both replicas start here as the backup's machine,
                // restored from checkpoint 0: digest chains and cached
                // translations (none) alike.
                m.begin_as_restored();
                let name = format!("the backup at {}", channel.peer());
                let written = channel.written();
                let mut recorder = Recorder::resume(channel, written, name, Some(go_live_every));
                if disks.backup_reads {
                    recorder.omit_read_data();
                }
                let lockstep = Lockstep::new(recorder, arbiter, me, events.clone(), lag_threshold, disks);
                match epoch {
                    Some(mode) => (Box::new(Epoch::new(lockstep, mode)), bytes),
                    None => (Box::new(lockstep), bytes),
                }
            }
        };
        // Protected from here: outputs leave only while the backup's
        // acknowledgements keep the lease (or the arbiter says so).
        fence.lease();
        let pause = t0.elapsed();
        let total = started.map_or(pause, |s| s.elapsed());
        let done =
            Transferred { generation, rounds: round, pages: pages + final_pages, final_pages, bytes, pause, total };
        events.emit(PairEvent::MachineSent { transfer: done.figures() });
        events.emit(PairEvent::Protected { backup, generation, mode });
        Ok((successor, done))
    }

    fn status(&mut self) -> Option<PairStatus> {
        Some(self.transfer_status())
    }

    fn finish(self: Box<Self>, _m: &mut E, _status: Option<u32>) -> Result<(), ProtectionError> {
        Ok(())
    }
}
