//! What happens to a side of a pair, as typed events ([`PairEvent`]) with
//! their place and time in the side's journal ([`EventRecord`]): what a
//! journal file holds a line of, and what the control socket's `events`
//! streams. The journal itself is the protection library's
//! (`ftvm_protection::events::Events`).

use crate::mode::Mode;
use serde::{Deserialize, Serialize};

/// Something that happened to a side of a pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum PairEvent {
    /// A backup listens for its primary.
    Listening {
        /// The address it listens on.
        address: String,
    },
    /// A waiting backup closed a connection that did not prove it holds
    /// the pair's key (garbage, another key, or silence), and listens on.
    StrangerRefused {
        /// The connection's source address.
        peer: String,
        /// What was wrong with it.
        reason: String,
    },
    /// A backup checked the primary's header and follows its stream.
    Following {
        /// The primary's address.
        primary: String,
        /// The pair's generation at the arbiter.
        generation: u64,
        /// The mode's name: lockstep, epoch or checkpoint.
        mode: Mode,
    },
    /// A backup refuses to follow its primary (and tells it why).
    RefusingToFollow {
        /// Why, as told to the primary.
        reason: String,
    },
    /// A primary's backup refused to follow it, or failed before protection started.
    RefusedProtection {
        /// Why: the backup's refusal, its failure, or no answer in time.
        reason: String,
    },
    /// A primary sends its backup the disk blocks its copies lack.
    DiskBlocksSent {
        /// Blocks sent, over all disks.
        blocks: u64,
        /// Bytes of those blocks.
        bytes: u64,
    },
    /// A backup's copy of a disk differs from the primary's: it asks for the blocks.
    DiskDiffers {
        /// The backup's copy.
        path: String,
    },
    /// A backup's copy of a disk is now the primary's.
    DiskCopied {
        /// The backup's copy.
        path: String,
        /// Blocks received to make it so.
        blocks: u64,
        /// Bytes of those blocks.
        bytes: u64,
    },
    /// A running VM's protection began: its machine goes to the backup
    /// while the guest runs on (pre-copy), before the pair starts.
    Protecting {
        /// The backup's address.
        backup: String,
        /// The pair's generation at the arbiter.
        generation: u64,
        /// The mode the pair will run in.
        mode: Mode,
    },
    /// A running VM's machine is with its backup: the pre-copy's rounds
    /// and the final pause that sent the rest.
    MachineSent {
        /// What the transfer took.
        #[serde(flatten)]
        transfer: TransferFigures,
    },
    /// A running VM's protection did not start (the reason); it runs on
    /// as it did.
    ProtectionFailed {
        /// Why.
        reason: String,
    },
    /// A primary is protected: its backup follows.
    Protected {
        /// The backup's address.
        backup: String,
        /// The pair's generation at the arbiter.
        generation: u64,
        /// The mode's name: lockstep, epoch or checkpoint.
        mode: Mode,
    },
    /// A primary hands its VM over to its backup on purpose (a
    /// switchover: `handover` on the control socket, or SIGTERM).
    HandingOver {
        /// The backup's address.
        backup: String,
        /// The pair's generation at the arbiter.
        generation: u64,
    },
    /// A primary's backup took the VM over: this side has stopped and exits.
    HandedOver {
        /// The generation the backup won.
        generation: u64,
        /// From the guest's stop to the backup's claim, in milliseconds.
        millis: u64,
    },
    /// A handover did not complete (the backup failed during it): the
    /// primary won the arbiter itself and runs on, unprotected.
    HandOverFailed {
        /// What went wrong.
        reason: String,
    },
    /// A backup received its primary's handover: it goes live at once.
    HandOverReceived {
        /// The primary's address.
        primary: String,
        /// The pair's generation at the arbiter.
        generation: u64,
    },
    /// This side declared the other failed (`who`: primary or backup).
    DeclaredFailed {
        /// The side declared failed: `primary` or `backup`.
        who: String,
        /// What showed it: a closed or silent channel, or no heartbeat.
        reason: String,
    },
    /// This side reached none of its isolation addresses after declaring
    /// the other failed: it may be the one cut off, so it leaves the
    /// arbiter to the other side for a while before it contends.
    Isolated {
        /// The addresses that did not answer.
        addresses: Vec<String>,
        /// How long it waits for the other side to claim, in milliseconds.
        defer_ms: u64,
    },
    /// The arbiter's store cannot be reached (a shared directory gone, an
    /// etcd without a quorum): this side waits for it before it may go
    /// live.
    ArbiterUnreachable {
        /// The store, as messages name it.
        store: String,
        /// Why it cannot be reached.
        problem: String,
    },
    /// This side won the pair's generation at the arbiter.
    ArbiterWon {
        /// The generation it won.
        generation: u64,
    },
    /// The other side had won it.
    ArbiterLost {
        /// The generation it asked for.
        generation: u64,
        /// The side that won it, by its name in the arbiter's record.
        winner: String,
    },
    /// Protection was stopped on purpose (`unprotect`): the backup
    /// acknowledged the stream's end and stopped; the VM runs on alone.
    ProtectionStopped {
        /// Outputs that had been held and were released.
        released: u64,
    },
    /// The pair's failure timeout changed on purpose: on the primary
    /// when it sent the change to its backup, on the backup when the
    /// control entry reached it.
    TimeoutChanged {
        /// The new timeout, in milliseconds.
        timeout_ms: u64,
    },
    /// The VM's CPU limit changed on purpose: on the primary when it
    /// sent the change to its backup, on the backup when the control
    /// entry reached it (its VM runs under it once it goes live).
    CpuLimitChanged {
        /// Percent of one host core; 100 is no limit.
        percent: u8,
    },
    /// A primary that won runs on alone, its held outputs released.
    Unprotected {
        /// Outputs that had been held and were released.
        released: u64,
    },
    /// A backup goes live: at `instruction` (checkpoint mode: from
    /// `checkpoint`; epoch mode: having checked `epoch_inputs`, each at an
    /// epoch end, `epoch_inputs_at_multiples` of them at a multiple of the
    /// epoch length).
    GoingLive {
        /// The instruction count it goes live at.
        instruction: u64,
        /// In checkpoint mode, the checkpoint it goes live from.
        checkpoint: Option<u64>,
        /// In epoch mode, the inputs it replayed, each at an epoch end.
        epoch_inputs: Option<u64>,
        /// In epoch mode, those of them at a multiple of the epoch length.
        epoch_inputs_at_multiples: Option<u64>,
        /// TCP segments it sends again, the last of each connection
        /// (`resend`; after a failure only).
        #[serde(default)]
        segments_sent_again: u64,
        /// Frames the primary received that its guest never had, given
        /// to this guest.
        #[serde(default)]
        frames_given: u64,
    },
    /// This side lost at the arbiter and halts.
    Halting {
        /// Who went live instead, and for which generation.
        reason: String,
    },
    /// The primary ended the VM (`status`: the guest's, if it powered off).
    VmEnded {
        /// The guest's exit status, if it powered off.
        status: Option<u32>,
    },
}

/// An event with when it happened and its place in the journal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    /// 1, 2, 3, ... in the order of the journal.
    pub seq: u64,
    /// Milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// What happened.
    #[serde(flatten)]
    pub event: PairEvent,
}

impl std::fmt::Display for EventRecord {
    /// The event's JSON without its place and time: what `ftvm control
    /// SOCK events` shows after the time.
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let v = serde_json::to_value(&self.event).expect("an event serializes");
        write!(f, "{v}")
    }
}

/// What a running VM's transfer to its new backup took (the pre-copy's
/// rounds and the final pause that sent the rest): in the pair's
/// `machine_sent` event and in the reply to its `protect`, flattened into
/// both (their JSON says the figures as fields of their own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferFigures {
    /// Pre-copy rounds (the first is all of RAM in use).
    pub rounds: u32,
    /// Pages sent while the guest ran, and in the final pause.
    pub pages: u64,
    /// Pages sent in the final pause.
    pub final_pages: u64,
    /// Bytes of stream the transfer took.
    pub bytes: u64,
    /// The final pause: the guest stopped, in milliseconds.
    pub pause_ms: u64,
    /// From the start of the pre-copy to the pair's start, in ms.
    pub total_ms: u64,
}
