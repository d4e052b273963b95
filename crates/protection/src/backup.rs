//! The side that follows, as the host's backup run sees it: one interface
//! that the replay of lockstep and epoch mode (`lockstep::backup`) and the
//! checkpoint follower (`checkpoint::backup`) implement, so the run that
//! accepts the primary, asks the arbiter and goes live knows no mode by
//! name.
//!
//! A backup is prepared from the primary's header (refusing what it
//! cannot follow, before the primary's VM starts), follows the stream
//! until it ends or is cut, and after a cut whose arbiter it won hands
//! back the machine to go live with.

use crate::checkpoint::backup::PendingActivation;
use crate::control::ControlEntry;
use crate::error::ProtectionError;
use crate::status::BackupMode;
use ftvm_machine::Machine;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How far a backup is, as status shows it.
pub struct Progress {
    /// Instructions replayed (a checkpoint backup: as of its last
    /// committed checkpoint).
    pub icount: u64,
    /// The mode, with its figures.
    pub mode: BackupMode,
}

/// What a backup tells the run while it follows.
pub enum Report {
    /// How far it got, in what it reports to the primary for the lag
    /// (instructions replayed, or checkpoints committed).
    Executed(u64),
    /// From now on it holds a VM it could go live with.
    ReadyToTakeOver,
    /// The primary sent a control entry: the run makes the change on
    /// this side now (it concerns the host's side of the pair, the
    /// channel and heartbeats, not the VM).
    Control(ControlEntry),
}

/// How following ended, short of a divergence.
pub enum Followed {
    /// The primary ended the VM (with the guest's exit status, if it
    /// powered off).
    Ended(Option<u32>),
    /// The primary handed the VM over on purpose (a switchover): the
    /// backup holds it as the primary stopped it, and goes live with it
    /// at once, without waiting out a failure timeout.
    HandedOver,
    /// The stream stopped short: the primary failed, or it is unusable
    /// (the reason, for when nobody declared a failure).
    Cut(String),
}

/// The VM a backup goes live with.
pub struct TakeOver {
    /// The machine, stopped where it goes live.
    pub machine: Machine,
    /// This host's path of each of the VM's disks, in slot order.
    pub disks: Vec<PathBuf>,
    /// In checkpoint mode, the checkpoint it goes live from.
    pub checkpoint: Option<u64>,
    /// In epoch mode, the inputs it replayed, each at an epoch end, and
    /// of them those at a multiple of the epoch length.
    pub epoch_inputs: Option<(u64, u64)>,
    /// Segments to send again as it goes live, as (NIC slot, frame), in
    /// order ([`crate::resend`]).
    pub resend: Vec<(usize, Vec<u8>)>,
    /// Frames the primary received and never gave its guest (it died
    /// holding them for a point its stream had not reached), as (NIC
    /// slot, frame), in order: given to this guest as it goes live, as
    /// the network would deliver them late.
    pub undelivered: Vec<(usize, Vec<u8>)>,
    /// In checkpoint mode, the activation records still to write: the VM
    /// may run meanwhile, but none of its outputs may leave the host
    /// before they are written (see [`PendingActivation`]).
    pub activation: Option<PendingActivation>,
    /// What the guest showed on its console before it goes live, as far
    /// as this side saw it run (the last [`CONSOLE_KEPT`] bytes): the
    /// replay's, in lockstep and epoch mode; nothing in checkpoint mode,
    /// whose backup does not run the guest. A console attached to the
    /// live VM is shown it first, as the primary's console would have.
    pub console: Vec<u8>,
}

/// How much of the console's output a replaying backup keeps for its
/// live VM's console (as much as a running VM's console keeps).
pub const CONSOLE_KEPT: usize = 64 << 10;

/// The side that follows.
pub trait Backup {
    /// Whether it already holds a VM it could go live with (a replay
    /// does from the start; a checkpoint backup once one is committed).
    fn ready_to_take_over(&self) -> bool;

    /// How far it is, readable from any thread while it follows.
    fn progress(&self) -> Arc<dyn Fn() -> Progress + Send + Sync>;

    /// Follows the primary's stream until it ends or is cut, telling
    /// `report` as it goes. An error is a divergence or a stream that
    /// cannot be trusted: this replica must never go live.
    fn follow(&mut self, report: &mut dyn FnMut(Report)) -> Result<Followed, ProtectionError>;

    /// What it followed, for the last words: the text after "the primary
    /// ended the VM (...)".
    fn summary(&self) -> String;

    /// After a cut, with the arbiter won for `generation` (`why`, `since`
    /// the failure was declared): says so and hands back the VM to go
    /// live with. `me` names this host.
    fn take_over(
        self: Box<Self>,
        why: &str,
        since: Duration,
        generation: u64,
        me: &str,
    ) -> Result<TakeOver, ProtectionError>;
}
