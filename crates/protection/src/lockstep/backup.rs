//! The backup's side of lockstep and epoch mode: the same machine built
//! from the log's header, replaying the log as it arrives
//! (`ftvm_replay::replayer`), silent (its outputs are regenerated and
//! dropped, or with separate disks and backup reads performed on its own
//! copies, `backup_disks`). Where the stream is cut it stands at the last
//! go-live point it received, from where it can go live (§2.4); disk I/O
//! in flight there is issued again when it does (§3.4).

use super::backup_disks::BackupDisks;
use crate::backup::{Backup, Followed, Progress, Report, TakeOver, CONSOLE_KEPT};
use crate::checkpoint::backup::{copies_to_sync, receive_machine, Disks};
use crate::control::ControlEntry;
use crate::epoch::backup::EpochCheck;
use crate::error::{PeerError, ProtectionError};
use crate::events::Events;
use crate::local::LocalFiles;
use crate::pair::{DiskDigest, DiskSharing, PairHeader, SlotDisks};
use crate::resend::{Keeping, LastSegments};
use crate::status::BackupMode;
use ftvm_machine::Machine;
use ftvm_replay::replayer::{self, FrameRule, NoRule, Outcome, Replayed};
use ftvm_replay::{Header, LogReader};
use std::collections::VecDeque;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A backup that replays the primary's log.
pub struct ReplayBackup<R: Read> {
    reader: LogReader<R>,
    /// The machine, from the header; for a running VM given a backup, it
    /// comes in the stream after the header (RAM of the size given).
    m: Result<Machine, u64>,
    /// Its own disk I/O, when it does any.
    disks_io: Option<BackupDisks>,
    /// A running VM's separate disks: this host's copies, made the same
    /// as the primary's while its machine comes; its disk I/O (the
    /// policy's backup reads) starts once they are.
    copies: Option<(Disks, bool)>,
    /// This host's path of each disk.
    disks: SlotDisks,
    rule: Box<dyn FrameRule>,
    replayed: Replayed,
    /// The last segment of each TCP connection the replay made.
    segments: LastSegments,
    show_console: bool,
    /// The end of what the replayed guest showed on its console (see
    /// [`TakeOver::console`]).
    shown: VecDeque<u8>,
    /// The last go-live point received, and the instruction replayed to.
    received_end: Arc<AtomicU64>,
    executed: Arc<AtomicU64>,
    epoch: Option<crate::status::EpochSetting>,
}

impl<R: Read> ReplayBackup<R> {
    /// Everything a backup checks before it acknowledges the header: the
    /// same machine in the same state, and with separate disks the same
    /// disks (a running VM's: the blocks that differ asked for with
    /// `request`, to come with its machine). The disks' paths are this
    /// host's (`local`).
    pub fn prepare(
        reader: LogReader<R>,
        header: &Header,
        pair: &PairHeader,
        local: &LocalFiles,
        request: &dyn Fn(Vec<u8>) -> Result<(), ProtectionError>,
        events: &Events,
        show_console: bool,
    ) -> Result<Self, ProtectionError> {
        let policy = pair.disk_policy;
        let streamed = replayer::is_streamed(header);
        let m = if streamed { Err(replayer::header_ram(header)?) } else { Ok(replayer::start_machine(header, local)?) };
        let disks = local.disk_paths(pair)?;
        let paths: Vec<(usize, &Path)> = disks.iter().map(|(s, p)| (*s, p.as_path())).collect();
        let separate = policy.sharing == DiskSharing::Separate;
        let mut copies = None;
        if separate && streamed {
            // A running VM's disk changes while it is copied: the blocks
            // that differ now come with its machine, and its writes since.
            copies_to_sync(pair, &disks, request, events)?;
            copies = Some((Disks::open(&paths, events.clone())?, policy.backup_reads));
        } else if separate {
            check_copies(pair, &disks)?;
        }
        let disks_io = match (policy.sharing, policy.backup_reads) {
            (DiskSharing::Shared, false) => None,
            // Opened (and locked) once the copies are made the same.
            _ if copies.is_some() => None,
            (_, reads) => Some(BackupDisks::open(&paths, separate, reads)?),
        };
        let mode = pair.epoch_mode();
        let rule: Box<dyn FrameRule> = match mode {
            Some(mode) => Box::new(EpochCheck::new(mode)),
            None => Box::new(NoRule),
        };
        Ok(ReplayBackup {
            reader,
            m,
            disks_io,
            copies,
            disks,
            rule,
            replayed: Replayed::default(),
            segments: LastSegments::default(),
            show_console,
            shown: VecDeque::new(),
            received_end: Arc::default(),
            executed: Arc::default(),
            epoch: mode.map(|e| e.setting()),
        })
    }
}

impl<R: Read> Backup for ReplayBackup<R> {
    /// It holds the primary's starting state from the first (or once it
    /// has come, for a running VM given a backup).
    fn ready_to_take_over(&self) -> bool {
        self.m.is_ok()
    }

    fn progress(&self) -> Arc<dyn Fn() -> Progress + Send + Sync> {
        let (end, executed, epoch) = (self.received_end.clone(), self.executed.clone(), self.epoch.clone());
        Arc::new(move || {
            // The end first: read in the other order, status could show
            // the machine past the end it had.
            let last_end = end.load(Ordering::SeqCst);
            let mode = match &epoch {
                Some(setting) => BackupMode::Epoch { setting: setting.clone(), last_end },
                None => BackupMode::Lockstep { last_end },
            };
            Progress { icount: executed.load(Ordering::SeqCst), mode }
        })
    }

    fn follow(&mut self, report: &mut dyn FnMut(Report)) -> Result<Followed, ProtectionError> {
        if let Err(ram_size) = self.m {
            let copies = self.copies.as_mut().map(|(disks, _)| disks);
            let Some(mut m) = receive_machine(self.reader.input_mut(), ram_size, copies)? else {
                return Ok(Followed::Cut("the primary's stream ended before its machine had come whole".into()));
            };
            if let Some((disks, reads)) = self.copies.take() {
                // The copies are the primary's: from here on this side
                // performs the log's writes on them, as from a boot.
                drop(disks);
                let paths: Vec<(usize, &Path)> = self.disks.iter().map(|(s, p)| (*s, p.as_path())).collect();
                self.disks_io = Some(BackupDisks::open(&paths, true, reads)?);
            }
            // The state digests of the log hash the pages written.
            m.set_dirty_tracking(true);
            eprintln!("ftvm: the primary's running machine has come, at instruction {}", m.icount());
            self.m = Ok(m);
            report(Report::ReadyToTakeOver);
        }
        let Ok(m) = &mut self.m else { unreachable!("received above") };
        let io: &mut dyn replayer::ReplayIo = match &mut self.disks_io {
            Some(d) => d,
            None => &mut replayer::Regenerate,
        };
        let io = &mut Keeping { inner: io, segments: &mut self.segments };
        let (end, executed) = (&self.received_end, &self.executed);
        let (shown, mut stdout) = (&mut self.shown, replayer::to_stdout(self.show_console));
        let mut console = |out: &[u8]| {
            stdout(out);
            shown.extend(out);
            let over = shown.len().saturating_sub(CONSOLE_KEPT);
            shown.drain(..over);
        };
        // Control entries come in order with the log; the report of the
        // progress and of them both go to the run, so both closures hand
        // theirs through one cell.
        let report = std::cell::RefCell::new(report);
        let outcome = replayer::replay_log(
            &mut self.reader,
            m,
            io,
            &mut console,
            &mut self.replayed,
            self.rule.as_mut(),
            &mut |bytes| {
                let entry = ControlEntry::decode(bytes)?;
                (report.borrow_mut())(Report::Control(entry));
                Ok(())
            },
            |i, last_end| {
                end.store(last_end, Ordering::SeqCst);
                executed.store(i, Ordering::SeqCst);
                (report.borrow_mut())(Report::Executed(i));
            },
        );
        // Its locks go before the live VM opens the disks again.
        self.disks_io = None;
        Ok(match outcome? {
            Outcome::Ended(status) => Followed::Ended(status),
            Outcome::HandedOver => Followed::HandedOver,
            Outcome::Cut(e) => Followed::Cut(format!("the primary's log is unusable: {e}")),
        })
    }

    fn summary(&self) -> String {
        let Ok(m) = &self.m else { return " before its running machine had come".into() };
        format!(" at instruction {}; {} state checks matched{}", m.icount(), self.replayed.digests, self.rule.summary())
    }

    fn take_over(
        mut self: Box<Self>,
        why: &str,
        since: Duration,
        _generation: u64,
        _me: &str,
    ) -> Result<TakeOver, ProtectionError> {
        let m = self.m.map_err(|_| ProtectionError::NothingToTakeOver)?;
        eprintln!(
            "ftvm: going live at instruction {} ({why}; log drained {} ms after the failure was declared; {} state checks matched{})",
            m.icount(),
            since.as_millis(),
            self.replayed.digests,
            self.rule.summary()
        );
        let epoch_inputs = self.rule.inputs_checked();
        Ok(TakeOver {
            machine: m,
            disks: self.disks.into_iter().map(|(_, p)| p).collect(),
            checkpoint: None,
            epoch_inputs,
            resend: self.segments.recent(),
            undelivered: self.reader.take_waiting(),
            activation: None,
            console: self.shown.into(),
        })
    }
}

/// The primary's digest of each of its disks, from the pair's header.
pub fn primary_digests(pair: &PairHeader) -> Result<Vec<&str>, PeerError> {
    pair.disks.iter().map(|d| d.digest.as_deref().ok_or(PeerError::NoDigest)).collect()
}

/// Separate disks start identical (§4.1), or protection is refused.
fn check_copies(pair: &PairHeader, disks: &[(usize, PathBuf)]) -> Result<(), ProtectionError> {
    for ((_, path), theirs) in disks.iter().zip(primary_digests(pair)?) {
        if DiskDigest::of(path, None)?.whole() != theirs {
            return Err(ProtectionError::NotACopy(path.clone()));
        }
    }
    Ok(())
}
