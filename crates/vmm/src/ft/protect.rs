//! Giving a running VM a backup (`protect` on its control socket): a
//! plain `ftvm run`, a primary whose backup was lost, or a backup that
//! went live. The pair is set up on a thread of its own (connecting,
//! claiming a generation, the backup's checks), so the guest runs on
//! meanwhile; what it connected comes back to the live loop as a host
//! event, and becomes the transfer (`ftvm_protection::transfer`) that
//! sends the machine across while the guest runs and starts the pair
//! after a final pause.

use super::{connect_pair, Connected, ProtectConfig, ProtectSetup};
use crate::api::ControlError;
use crate::error::VmmError;
use crate::host_io::{HostEvent, HostIo};
use ftvm_machine::Machine;
use ftvm_protection::checkpoint::primary::Checkpointer;
use ftvm_protection::events::{Events, PairEvent};
use ftvm_protection::lockstep::BUSY_GO_LIVE;
use ftvm_protection::pair::DiskSharing;
use ftvm_protection::primary::Primary;
use ftvm_protection::transfer::{DiskCopies, Then, Transfer};
use ftvm_replay::recorder::{self, Start};
use std::sync::mpsc::Sender;
use std::time::Duration;

/// What the setup thread hands back to the live loop.
pub struct Setup {
    /// The transfer, ready to start, or why the pair could not be set up.
    pub transfer: Result<Box<Transfer>, VmmError>,
}

/// How a running VM is given a backup: what the live loop, which knows
/// no mode and no engine by name, asks of its host.
pub trait Protector<E> {
    /// Starts setting up a pair for the VM `m` (its devices served by
    /// `io`) as `args` say; the setup reports with
    /// [`HostEvent::Protection`] on `host_events`.
    fn start(
        &mut self,
        m: &E,
        io: &HostIo,
        args: ProtectConfig,
        host_events: Sender<HostEvent>,
    ) -> Result<(), ControlError>;

    /// The side that runs the VM while its machine goes across.
    fn transfer(&self, transfer: Box<Transfer>) -> Box<dyn Primary<E>>;
}

/// The protector of this crate's engine: every mode.
pub struct MachineProtector {
    /// The VM's journal (its control socket streams it); a `protect`
    /// that names its own events file gets a journal of its own.
    pub journal: Events,
}

impl Protector<Machine> for MachineProtector {
    fn start(
        &mut self,
        m: &Machine,
        io: &HostIo,
        args: ProtectConfig,
        host_events: Sender<HostEvent>,
    ) -> Result<(), ControlError> {
        let refuse = |e: VmmError| ControlError::ProtectFailed(e.to_string());
        args.disk_sharing().map_err(refuse)?;
        let events = match &args.pair.events {
            Some(path) => Events::with_file(path).map_err(|e| ControlError::ProtectFailed(e.to_string()))?,
            None => self.journal.clone(),
        };
        let mut header =
            recorder::header(m, m.ram().size(), ftvm_machine::DEFAULT_GUEST_IPS, &io.describe(), Start::Streamed);
        let fence = io.fence();
        std::thread::Builder::new()
            .name("ft-protect".into())
            .spawn(move || {
                let transfer = connect(&args, &mut header, host_events.clone(), &events, fence);
                if let Err(e) = &transfer {
                    events.emit(PairEvent::ProtectionFailed { reason: e.to_string() });
                }
                let _ = host_events.send(HostEvent::Protection(Setup { transfer }));
            })
            .map_err(|e| ControlError::ProtectFailed(format!("cannot start the setup's thread: {e}")))?;
        Ok(())
    }

    fn transfer(&self, transfer: Box<Transfer>) -> Box<dyn Primary<Machine>> {
        transfer
    }
}

/// The setup's thread: the pair connected, and the transfer over it.
/// Public for a front end that serves the VM's I/O without a `HostIo`
/// (the in-process tests, `tests/ft_inprocess.rs`).
pub fn connect(
    args: &ProtectConfig,
    header: &mut ftvm_replay::Header,
    host_events: Sender<HostEvent>,
    events: &Events,
    fence: ftvm_replication::fence::Fence,
) -> Result<Box<Transfer>, VmmError> {
    let Connected { channel, arbiter, me, disks, copies, epoch, interval, .. } =
        connect_pair(args, header, host_events, events, fence)?;
    let generation = arbiter.generation();
    let copies = (disks.sharing == DiskSharing::Separate)
        .then(|| DiskCopies { disks: copies, requests: channel.take_requests() });
    let then = match interval {
        Some(_) => Then::Checkpoints,
        None => Then::Log {
            lag_threshold: Duration::from_millis(args.lag_threshold),
            disks,
            epoch,
            go_live_every: BUSY_GO_LIVE,
        },
    };
    let mode = then.mode();
    // The transfer goes as checkpoint 0; in checkpoint mode the same
    // sender goes on with the checkpoints after it.
    let interval = interval.unwrap_or(Duration::from_millis(25));
    let sender = Checkpointer::new(channel, interval, !args.no_idle_checkpoints, arbiter, me.clone(), events.clone())?;
    eprintln!("ftvm: protecting the running VM: its machine goes to the backup at {} ({mode})", args.backup);
    events.emit(PairEvent::Protecting { backup: args.backup.to_string(), generation, mode });
    Ok(Box::new(Transfer::new(sender, then, copies, me, events.clone())))
}
