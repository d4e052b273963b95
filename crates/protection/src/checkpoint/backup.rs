//! The backup's side of checkpoint mode (Remus, ../../../../shared/seeds/remus.txt
//! §2.2, §2.5, §2.6): it never executes the guest. It keeps a copy of
//! the VM's RAM and of its latest state, and commits each checkpoint as
//! it arrives whole: its pages into the RAM copy, then the disk writes of
//! its interval onto this host's copy of each disk. The channel acknowledged
//! the checkpoint's bytes on receipt, so the primary's held frames go as
//! soon as the backup holds the checkpoint in memory; a backup that dies
//! before committing it leaves nothing to take over anyway.
//!
//! When the stream is cut, an incomplete checkpoint and the disk writes
//! after the last whole one are dropped: the VM goes live from the last
//! committed checkpoint, with this host's disks exactly as they were then,
//! flushed and marked valid by an activation record before it runs.

use crate::backup::{Backup, Followed as Follow, Progress, Report, TakeOver};
use crate::control::ControlEntry;
use crate::error::{file, PeerError, ProtectionError};
use crate::events::{Events, PairEvent};
use crate::local::LocalFiles;
use crate::lockstep::backup::primary_digests;
use crate::pair::{DiskDigest, DiskSharing, PairHeader, SlotDisks};
use crate::resend::LastSegments;
use crate::status::BackupMode;
use ftvm_host::{DiskImage, FileBackend};
use ftvm_machine::layout::RAM_BASE;
use ftvm_machine::BlockBackend;
use ftvm_machine::{GuestRam, Machine, MachineError};
use ftvm_replay::replayer::{header_ram, machine_number};
use ftvm_replay::waiting::WaitingFrames;
use ftvm_replay::Header;
use ftvm_replication::checkpoint_stream::{ReadError, Reader, Record};
use ftvm_replication::disk_sync::{self, DigestList};
use ftvm_replication::page_delta::{self, PAGE_SIZE};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Frames, each with the slot of the NIC it belongs to.
type SlotFrames = Vec<(usize, Vec<u8>)>;

/// Largest machine state (without RAM) a checkpoint may unpack to.
const MAX_STATE: usize = 64 << 20;

/// What the backup holds: the last committed checkpoint.
pub struct Committed {
    /// The copy of the VM's RAM, as of the last commit.
    pub ram: GuestRam,
    /// The machine's state at the last commit; None before the first.
    pub state: Option<Vec<u8>>,
    /// The last committed checkpoint's number (0 before the first).
    pub number: u64,
    /// The instruction count the last committed checkpoint was taken at.
    pub icount: u64,
    /// Checkpoints committed so far.
    pub checkpoints: u64,
    /// Disk writes applied so far.
    pub writes: u64,
    /// Frames the primary's guest received toward checkpoints not
    /// committed, by the checkpoint's number: a guest resumed from the
    /// last commit never had them.
    pub received: WaitingFrames<u64>,
    /// The last segment of each connection the guest sent up to the last
    /// commit.
    pub segments: LastSegments,
}

impl Committed {
    /// Nothing committed yet, with a zeroed copy of `ram_size` bytes of RAM.
    pub fn new(ram_size: u64) -> Result<Committed, ProtectionError> {
        Ok(Committed {
            ram: GuestRam::new(RAM_BASE, ram_size).map_err(MachineError::from)?,
            state: None,
            number: 0,
            icount: 0,
            checkpoints: 0,
            writes: 0,
            received: WaitingFrames::default(),
            segments: LastSegments::default(),
        })
    }

    /// What the network lost with the primary, taken for the VM going live
    /// from the last commit: the last segment of each connection, to send
    /// again, and the frames received after it, to give the guest.
    pub fn take_frames(&mut self) -> (SlotFrames, SlotFrames) {
        (std::mem::take(&mut self.segments).recent(), self.received.take())
    }

    /// The VM as of the last committed checkpoint.
    pub fn into_machine(self) -> Result<Machine, ProtectionError> {
        let state = self.state.ok_or(ProtectionError::NothingToTakeOver)?;
        Ok(Machine::from_checkpoint(&state, self.ram)?)
    }
}

/// Where the backup's copy of the VM stood when it went live, as its
/// activation records say.
#[derive(Debug, Clone, Copy)]
pub struct Activation {
    /// The last committed checkpoint's number.
    pub number: u64,
    /// The instruction count it was taken at.
    pub icount: u64,
    /// Disk writes applied so far.
    pub writes: u64,
}

/// Before the backup's VM begins execution (Remus §2.5): each disk the
/// committed checkpoints wrote is flushed to stable storage, and then an
/// activation record is written beside it (`DISK.activation`), which marks
/// this copy as the valid one from `generation` on. After a crash of both
/// hosts the records tell which copy of the disk to trust. Returns the
/// records' paths.
pub fn activate(
    disks: &[PathBuf],
    held: Activation,
    generation: u64,
    me: &str,
) -> Result<Vec<PathBuf>, ProtectionError> {
    let mut records = Vec::new();
    for disk in disks {
        let flush = file("activating: cannot flush the disk", disk);
        std::fs::OpenOptions::new().write(true).open(disk).and_then(|f| f.sync_all()).map_err(flush)?;
        let record = PathBuf::from(format!("{}.activation", disk.display()));
        let tmp = PathBuf::from(format!("{}.activation.part", disk.display()));
        let when = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let text = format!(
            "ftvm activation record\ngeneration={generation}\nby={me}\ncheckpoint={}\nicount={}\ndisk_writes={}\n\
             unix_time={}\n",
            held.number,
            held.icount,
            held.writes,
            when.as_secs()
        );
        let write = |tmp: &Path| -> std::io::Result<()> {
            let mut f = std::fs::File::create(tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(tmp, &record)
        };
        write(&tmp).map_err(file("activating: cannot write the activation record", &record))?;
        if let Some(dir) = record.parent() {
            let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(file("activating: cannot flush the directory", dir))?;
        }
        records.push(record);
    }
    Ok(records)
}

/// The activation a checkpoint backup going live still owes (Remus
/// §2.5): written while its VM already runs, but before anything of that
/// VM leaves the host. The live VM's frames wait until
/// [`PendingActivation::write`] has returned, so what the world outside
/// can see keeps the order of §2.5 (disks flushed, records durable, then
/// the VM's first output), and the records' fsyncs (2-14 ms measured)
/// overlap the VM's first instructions instead of preceding them in a
/// handover's pause. Its disk writes need not wait: the copies are this
/// host's own, the flush still covers every committed write, and a
/// record never written leaves the copy unvouched for whatever the VM
/// wrote after.
pub struct PendingActivation {
    disks: Vec<PathBuf>,
    held: Activation,
    generation: u64,
    me: String,
}

impl PendingActivation {
    /// Flushes the disks and writes the records; returns the records'
    /// paths. Until it has returned Ok, no output of the VM may leave.
    pub fn write(self) -> Result<Vec<PathBuf>, ProtectionError> {
        activate(&self.disks, self.held, self.generation, &self.me)
    }
}

/// This host's copies of the VM's disks, written at commits.
pub struct Disks {
    disks: HashMap<u32, (DiskImage, FileBackend)>,
    /// Copies that differed from the primary's when protection started
    /// (slot, the primary's digest): its blocks come ahead of the first
    /// checkpoint, after which the copy must hash the same.
    unsynced: Vec<(u32, String)>,
    /// Blocks and bytes received to make the copies the same.
    synced: (u64, u64),
    /// Writes of the checkpoint in progress (slot, offset, data), applied
    /// when it commits.
    staged: Vec<(u32, u64, Vec<u8>)>,
    events: Events,
}

impl Disks {
    /// Opens (and locks) this host's copy at each (slot, path) in `disks`.
    pub fn open(disks: &[(usize, &Path)], events: Events) -> Result<Disks, ProtectionError> {
        let mut open = HashMap::new();
        for &(slot, path) in disks {
            let image = DiskImage::open(path, false)?;
            let backend = image.backend().map_err(file("disk", path))?;
            open.insert(slot as u32, (image, backend));
        }
        Ok(Disks { disks: open, unsynced: Vec::new(), synced: (0, 0), staged: Vec::new(), events })
    }

    /// The copy in `slot` differs from the primary's, whose digest is
    /// `theirs`: the blocks that make it the same are on their way.
    pub fn expect_blocks(&mut self, slot: usize, theirs: &str) {
        self.unsynced.push((slot as u32, theirs.to_string()));
    }

    /// The copy in `slot`, checked to hold `len` bytes at `offset`.
    fn range(&mut self, slot: u32, offset: u64, len: usize) -> Result<&mut (DiskImage, FileBackend), PeerError> {
        let disk = self.disks.get_mut(&slot).ok_or(PeerError::NoDiskInSlot(slot))?;
        if offset.checked_add(len as u64).is_none_or(|end| end > disk.1.size()) {
            return Err(PeerError::PastDiskEnd(slot));
        }
        Ok(disk)
    }

    /// A block of the disk as it was before the guest ran (or, for a
    /// running VM, as its sync read it): written at once, with no
    /// interval to wait for.
    fn sync_block(&mut self, slot: u32, offset: u64, data: &[u8]) -> Result<(), ProtectionError> {
        let (image, backend) = self.range(slot, offset, data.len())?;
        backend.write_at(offset, data).map_err(file("cannot write the backup's disk", image.path()))?;
        self.synced.0 += 1;
        self.synced.1 += data.len() as u64;
        Ok(())
    }

    /// A write of the checkpoint in progress, checked against its disk,
    /// kept until the checkpoint commits.
    fn stage(&mut self, slot: u32, offset: u64, data: Vec<u8>) -> Result<(), PeerError> {
        self.range(slot, offset, data.len())?;
        self.staged.push((slot, offset, data));
        Ok(())
    }

    /// Applies the staged writes of a checkpoint that commits, in order;
    /// returns how many.
    fn apply_staged(&mut self) -> Result<u64, ProtectionError> {
        let n = self.staged.len() as u64;
        for (slot, offset, data) in std::mem::take(&mut self.staged) {
            let (image, backend) = self.disks.get_mut(&slot).expect("checked on receipt");
            backend.write_at(offset, &data).map_err(file("cannot write the backup's disk", image.path()))?;
        }
        Ok(n)
    }

    /// Once the blocks are in: each copy that differed hashes as the
    /// primary's now, or the backup cannot follow.
    fn check_synced(&mut self) -> Result<(), ProtectionError> {
        for (slot, theirs) in self.unsynced.drain(..) {
            let (image, _) = &self.disks[&slot];
            let mine = DiskDigest::of(image.path(), DiskDigest::size_in(&theirs))?.whole();
            if mine != theirs {
                return Err(PeerError::StillDiffers(image.path().to_path_buf()).into());
            }
            eprintln!(
                "ftvm: the backup's disk {} is now a copy of the primary's ({} blocks, {:.1} MiB received)",
                image.path().display(),
                self.synced.0,
                self.synced.1 as f64 / (1 << 20) as f64
            );
            let (blocks, bytes) = self.synced;
            self.events.emit(PairEvent::DiskCopied { path: image.path().display().to_string(), blocks, bytes });
        }
        Ok(())
    }
}

/// How following the stream ended.
pub enum Followed {
    /// The primary ended the VM (with the guest's exit status, if it
    /// powered off).
    Ended(Option<u32>),
    /// The primary handed the VM over: it goes on from the last committed
    /// checkpoint, which the primary took with its guest stopped.
    HandedOver,
    /// The stream was cut: the primary failed, or the backup stopped
    /// listening.
    Cut,
}

/// What following the stream tells its caller as it goes.
pub enum Step<'a> {
    /// A checkpoint was committed.
    Committed(&'a Committed),
    /// The primary sent a control entry (it takes effect now).
    Control(ControlEntry),
}

/// Follows the stream, committing each whole checkpoint; `step` is told
/// of each, and of each control entry. An error means the stream cannot
/// be trusted: the backup must not go live from it.
pub fn follow(
    input: impl Read,
    held: &mut Committed,
    disks: &mut Disks,
    mut step: impl FnMut(Step),
) -> Result<Followed, ProtectionError> {
    let mut reader = Reader::new(input);
    // Pages of the checkpoint in progress that came ahead of it.
    let mut staged: Pages = Vec::new();
    // Last segments of the checkpoint in progress, ahead of it.
    let mut sent: Vec<(u64, usize, Vec<u8>)> = Vec::new();
    let next = |held: &Committed| if held.state.is_some() { held.number + 1 } else { 0 };
    loop {
        let record = match reader.next_record() {
            Ok(r) => r,
            Err(ReadError::Cut) => return Ok(Followed::Cut),
            Err(e @ ReadError::Corrupt { .. }) => return Err(PeerError::Stream(e).into()),
        };
        match record {
            Record::DiskWrite { slot, offset, data } => disks.stage(slot, offset, data)?,
            Record::DiskSync { slot, offset, data } => {
                if held.state.is_some() {
                    return Err(PeerError::LateDiskBlocks.into());
                }
                disks.sync_block(slot, offset, &data)?;
            }
            Record::Pages { number, pages } => {
                if number != next(held) {
                    return Err(PeerError::PagesOutOfOrder { number, due: next(held) }.into());
                }
                let pages = decode_pages(&held.ram, number, &pages)?;
                // Before the first commit there is nothing to keep whole:
                // the pages go straight in, as a running VM's pre-copy
                // resends a page each time it changed (decoded against
                // the version sent before, which must be there).
                if held.state.is_none() {
                    write_pages(&mut held.ram, pages);
                } else {
                    staged.extend(pages);
                }
            }
            Record::Checkpoint { number, icount, state, pages } => {
                if number != next(held) {
                    return Err(PeerError::CheckpointOutOfOrder { number, due: next(held) }.into());
                }
                disks.check_synced()?;
                let state = zstd::bulk::decompress(&state, MAX_STATE)
                    .map_err(|source| PeerError::CheckpointState { number, source })?;
                staged.extend(decode_pages(&held.ram, number, &pages)?);
                // Commit: everything was checked above, so nothing below
                // leaves the copy half-updated.
                write_pages(&mut held.ram, staged.drain(..));
                held.writes += disks.apply_staged()?;
                held.received.retain(|n| *n > number);
                for (_, slot, frame) in sent.drain(..).filter(|(n, ..)| *n == number) {
                    held.segments.saw(slot, &frame);
                }
                held.state = Some(state);
                held.number = number;
                held.icount = icount;
                held.checkpoints += 1;
                step(Step::Committed(held));
            }
            Record::Control(bytes) => step(Step::Control(ControlEntry::decode(&bytes)?)),
            Record::End { status } => return Ok(Followed::Ended(status)),
            Record::HandOver => {
                // The primary's guest stopped at the last checkpoint: a
                // write after it, or no checkpoint at all, is a primary
                // that does not know what it hands over.
                if held.state.is_none() || !disks.staged.is_empty() {
                    return Err(PeerError::HandOverMidInterval.into());
                }
                return Ok(Followed::HandedOver);
            }
            Record::Received { number, slot, frame } => {
                // Toward a checkpoint committed already: the guest had it.
                if number >= next(held) {
                    held.received.push(number, slot as usize, frame);
                }
            }
            Record::Sent { number, slot, frame } => sent.push((number, slot as usize, frame)),
            Record::KeepAlive => {}
        }
    }
}

/// Writes decoded pages into the copy of RAM (their addresses were
/// checked as they decoded).
fn write_pages(ram: &mut GuestRam, pages: impl IntoIterator<Item = (u64, Box<[u8; PAGE_SIZE]>)>) {
    let ram = ram.as_mut_slice_untracked();
    let base_pfn = RAM_BASE / PAGE_SIZE as u64;
    for (pfn, page) in pages {
        let i = (pfn - base_pfn) as usize;
        ram[i * PAGE_SIZE..(i + 1) * PAGE_SIZE].copy_from_slice(&page[..]);
    }
}

/// The machine of a running VM given a replay backup, as its protection
/// streams it after the header (`transfer`): the pages pre-copied while
/// it ran, then checkpoint 0, the rest and the state, taken in a final
/// pause with no I/O in flight. None if the stream is cut before the
/// machine is whole. With separate disks, `disks` are this host's copies:
/// the blocks that differ come at once, and the guest's writes since the
/// transfer began are applied with checkpoint 0, after them (a block the
/// sync read while the guest wrote it is made new by the write). With
/// shared disks (None), no disk data may come.
pub fn receive_machine(
    input: impl Read,
    ram_size: u64,
    mut disks: Option<&mut Disks>,
) -> Result<Option<Machine>, ProtectionError> {
    let mut held = Committed::new(ram_size)?;
    let mut reader = Reader::new(input);
    loop {
        let record = match reader.next_record() {
            Ok(r) => r,
            Err(ReadError::Cut) => return Ok(None),
            Err(e @ ReadError::Corrupt { .. }) => return Err(PeerError::Stream(e).into()),
        };
        match record {
            Record::Pages { number: 0, pages } => {
                let pages = decode_pages(&held.ram, 0, &pages)?;
                write_pages(&mut held.ram, pages);
            }
            Record::Checkpoint { number: 0, icount, state, pages } => {
                let state = zstd::bulk::decompress(&state, MAX_STATE)
                    .map_err(|source| PeerError::CheckpointState { number: 0, source })?;
                let pages = decode_pages(&held.ram, 0, &pages)?;
                write_pages(&mut held.ram, pages);
                if let Some(disks) = disks.as_deref_mut() {
                    disks.apply_staged()?;
                    let (blocks, bytes) = disks.synced;
                    eprintln!(
                        "ftvm: the backup's disks are copies of the primary's ({blocks} blocks, {:.1} MiB received)",
                        bytes as f64 / (1 << 20) as f64
                    );
                }
                held.state = Some(state);
                held.icount = icount;
                return held.into_machine().map(Some);
            }
            Record::DiskSync { slot, offset, data } => match disks.as_deref_mut() {
                Some(disks) => disks.sync_block(slot, offset, &data)?,
                None => return Err(PeerError::NotTransfer("disk").into()),
            },
            Record::DiskWrite { slot, offset, data } => match disks.as_deref_mut() {
                Some(disks) => disks.stage(slot, offset, data)?,
                None => return Err(PeerError::NotTransfer("disk").into()),
            },
            // The running VM's frames are not held while it is copied.
            Record::KeepAlive | Record::Received { .. } | Record::Sent { .. } => {}
            Record::Pages { number, .. } => return Err(PeerError::PagesOutOfOrder { number, due: 0 }.into()),
            Record::Checkpoint { number, .. } => return Err(PeerError::CheckpointOutOfOrder { number, due: 0 }.into()),
            Record::End { .. } => return Err(PeerError::NotTransfer("end").into()),
            Record::HandOver => return Err(PeerError::NotTransfer("handover").into()),
            Record::Control(_) => return Err(PeerError::NotTransfer("control").into()),
        }
    }
}

/// A checkpoint's pages, decoded against the committed copy of RAM (the
/// pages of one checkpoint are distinct, so pieces of it decode alike).
/// Guest pages: (guest-physical address, content).
type Pages = Vec<(u64, Box<[u8; PAGE_SIZE]>)>;

fn decode_pages(ram: &GuestRam, number: u64, blob: &[u8]) -> Result<Pages, PeerError> {
    let ram = ram.as_slice();
    let base_pfn = RAM_BASE / PAGE_SIZE as u64;
    page_delta::decode(blob, |pfn| {
        // Checked: a pfn far past RAM wrapped around to a page in it.
        let i = usize::try_from(pfn.checked_sub(base_pfn)?).ok()?;
        ram.get(i.checked_mul(PAGE_SIZE)?..i.checked_add(1)?.checked_mul(PAGE_SIZE)?)
    })
    .map_err(|source| PeerError::Pages { number, source })
}

/// A backup that commits the primary's checkpoints.
pub struct CheckpointBackup<R: Read> {
    stream: R,
    held: Committed,
    /// This host's copies of the disks, open while it follows.
    files: Option<Disks>,
    disks: SlotDisks,
    interval_ms: u64,
    /// Checkpoints committed, and the instruction count of the last.
    committed: Arc<AtomicU64>,
    committed_icount: Arc<AtomicU64>,
    _flusher: Flusher,
}

/// How often a following backup flushes its copies of the disks.
const FLUSH_EVERY: Duration = Duration::from_millis(500);

/// Flushes the backup's copies of the disks to stable storage every
/// [`FLUSH_EVERY`] while it follows, so that going live, which must
/// flush them before it writes its activation record, finds little left
/// to write: a copy made or synced just before protection started can
/// hold a gigabyte of dirty pages, half a second of flushing inside the
/// failover (measured: 545 ms of a 600 ms handover). Stops when dropped.
struct Flusher {
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Flusher {
    fn start(paths: Vec<PathBuf>) -> Result<Flusher, ProtectionError> {
        // Any descriptor of a file flushes all of its dirty pages.
        let files = paths
            .iter()
            .map(|p| std::fs::File::open(p).map_err(file("cannot open the backup's disk", p)))
            .collect::<Result<Vec<_>, _>>()?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::Builder::new()
            .name("ft-disk-flush".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    std::thread::sleep(FLUSH_EVERY);
                    for f in &files {
                        // A failure shows again, and counts, at activation.
                        let _ = f.sync_data();
                    }
                }
            })
            .map_err(|e| ProtectionError::Thread("disk flusher", e))?;
        Ok(Flusher { stop })
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl<R: Read> CheckpointBackup<R> {
    /// Everything a checkpoint backup checks before it acknowledges the
    /// header: a copy of each disk on this host (made the primary's size
    /// if missing or different, its differing blocks asked for with
    /// `request`). `given`: this host's paths of the disks, in order.
    pub fn prepare(
        stream: R,
        header: &Header,
        pair: &PairHeader,
        interval_ms: u64,
        local: &LocalFiles,
        request: &dyn Fn(Vec<u8>) -> Result<(), ProtectionError>,
        events: &Events,
    ) -> Result<Self, ProtectionError> {
        let ram = ram_size(header)?;
        if pair.disk_policy.sharing != DiskSharing::Separate {
            return Err(ProtectionError::SharedDisks);
        }
        // The machine is built as it goes live: what it needs first is
        // made now (26 MB for two harts, 10 ms of a handover otherwise).
        Machine::prepare_harts(harts_to_prepare(header));
        let disks = local.disk_paths(pair)?;
        let to_sync = copies_to_sync(pair, &disks, request, events)?;
        let paths: Vec<(usize, &Path)> = disks.iter().map(|(s, p)| (*s, p.as_path())).collect();
        let mut files = Disks::open(&paths, events.clone())?;
        for (slot, theirs) in to_sync {
            files.expect_blocks(slot, &theirs);
        }
        let flusher = Flusher::start(disks.iter().map(|(_, p)| p.clone()).collect())?;
        Ok(CheckpointBackup {
            stream,
            held: Committed::new(ram)?,
            files: Some(files),
            disks,
            interval_ms,
            committed: Arc::default(),
            committed_icount: Arc::default(),
            _flusher: flusher,
        })
    }

    fn committed_summary(&self) -> String {
        format!("{} checkpoints committed, {} disk writes applied", self.held.checkpoints, self.held.writes)
    }
}

impl<R: Read> Backup for CheckpointBackup<R> {
    /// Only with a checkpoint to go live from is there anything to take
    /// over: until then a failure just ends the stream, and the arbiter
    /// is left to the primary.
    fn ready_to_take_over(&self) -> bool {
        self.held.state.is_some()
    }

    fn progress(&self) -> Arc<dyn Fn() -> Progress + Send + Sync> {
        let (c, at, interval_ms) = (self.committed.clone(), self.committed_icount.clone(), self.interval_ms);
        Arc::new(move || {
            let committed = c.load(Ordering::Relaxed);
            Progress { icount: at.load(Ordering::Relaxed), mode: BackupMode::Checkpoint { interval_ms, committed } }
        })
    }

    fn follow(&mut self, report: &mut dyn FnMut(Report)) -> Result<Follow, ProtectionError> {
        let mut files = self.files.take().expect("a checkpoint backup follows once");
        let (committed, at) = (&self.committed, &self.committed_icount);
        let outcome = follow(&mut self.stream, &mut self.held, &mut files, |step| match step {
            Step::Committed(c) => {
                at.store(c.icount, Ordering::Relaxed);
                committed.store(c.checkpoints, Ordering::Relaxed);
                report(Report::Executed(c.checkpoints));
                report(Report::ReadyToTakeOver);
            }
            Step::Control(entry) => report(Report::Control(entry)),
        });
        // Their locks go before the live VM opens the disks again.
        drop(files);
        Ok(match outcome? {
            Followed::Ended(status) => Follow::Ended(status),
            Followed::HandedOver => Follow::HandedOver,
            Followed::Cut => Follow::Cut(format!(
                "the primary's checkpoint stream ended {}",
                if self.held.state.is_none() { "before its first checkpoint" } else { "without a failure" }
            )),
        })
    }

    fn summary(&self) -> String {
        format!("; {}", self.committed_summary())
    }

    fn take_over(
        mut self: Box<Self>,
        why: &str,
        since: Duration,
        generation: u64,
        me: &str,
    ) -> Result<TakeOver, ProtectionError> {
        let line = format!(
            "ftvm: going live from checkpoint {} at instruction {} ({why}; {}; {} ms after the failure was declared)",
            self.held.number,
            self.held.icount,
            self.committed_summary(),
            since.as_millis()
        );
        let disks: Vec<PathBuf> = self.disks.into_iter().map(|(_, p)| p).collect();
        let held = Activation { number: self.held.number, icount: self.held.icount, writes: self.held.writes };
        let checkpoint = Some(self.held.number);
        let (resend, undelivered) = self.held.take_frames();
        // The disks' flush and the records (some fsyncs, 5-11 ms measured
        // in a handover) are left to the live VM's host, which writes them
        // while the VM runs with its outputs held (`PendingActivation`).
        let started = std::time::Instant::now();
        let machine = self.held.into_machine()?;
        tracing::debug!(build_us = started.elapsed().as_micros() as u64, "checkpoint backup: the machine built");
        eprintln!("{line}");
        let activation = PendingActivation { disks: disks.clone(), held, generation, me: me.to_string() };
        Ok(TakeOver {
            machine,
            disks,
            checkpoint,
            epoch_inputs: None,
            resend,
            undelivered,
            activation: Some(activation),
            console: Vec::new(),
        })
    }
}

/// Each copy of a disk that is missing or differs from the primary's (by
/// the digests in the pair's header) is made the same size, and the
/// primary is asked for the blocks whose digests differ (Remus §2.5: the
/// copies start the same). Returns (slot, the primary's digest) of those.
pub(crate) fn copies_to_sync(
    pair: &PairHeader,
    disks: &[(usize, PathBuf)],
    request: &dyn Fn(Vec<u8>) -> Result<(), ProtectionError>,
    events: &Events,
) -> Result<Vec<(usize, String)>, ProtectionError> {
    let mut to_sync = Vec::new();
    for ((slot, path), theirs) in disks.iter().zip(primary_digests(pair)?) {
        let size = DiskDigest::size_in(theirs).ok_or(PeerError::DigestWithoutSize)?;
        let e = |e: std::io::Error| file("cannot make the backup's disk", path)(e);
        let file =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(e)?;
        if file.metadata().map_err(e)?.len() != size {
            // A new copy is a sparse file: only the blocks the primary
            // has data in differ from it.
            file.set_len(size).map_err(e)?;
        }
        let mine = DiskDigest::of(path, Some(size))?;
        // A running VM's disk changes while it is copied: the blocks are
        // asked for whatever this copy holds, and there is no digest of
        // the primary's to check the copy against after them (its writes
        // since come with checkpoint 0).
        let streamed = DiskDigest::is_streamed(theirs);
        if mine.whole() == theirs {
            continue;
        }
        let list = DigestList { slot: *slot as u32, size, block: disk_sync::block_size(size), digests: mine.blocks };
        let blocks = list.digests.len();
        request(list.encode())?;
        eprintln!(
            "ftvm: the backup's disk {} differs from the primary's: asking for the blocks that differ ({blocks} compared)",
            path.display()
        );
        events.emit(PairEvent::DiskDiffers { path: path.display().to_string() });
        if !streamed {
            to_sync.push((*slot, theirs.to_string()));
        }
    }
    Ok(to_sync)
}

/// The harts whose tables a backup makes ahead: the header's count (1 if
/// it has none), at most [`PREPARED_HARTS_MOST`] (52 MB each, held for
/// as long as the backup follows; any more are made as the machine runs).
fn harts_to_prepare(header: &Header) -> usize {
    let harts = machine_number(header, "harts").ok().and_then(|n| usize::try_from(n).ok());
    harts.unwrap_or(1).clamp(1, PREPARED_HARTS_MOST)
}

/// See [`harts_to_prepare`].
const PREPARED_HARTS_MOST: usize = 8;

/// The VM's RAM size, from the header's machine line.
fn ram_size(header: &Header) -> Result<u64, PeerError> {
    header_ram(header).map_err(|_| PeerError::NoRamSize)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page numbered so far past RAM that its offset wraps around
    /// (2^52 pages on): refused, not taken for page 0 (found by the
    /// checkpoint_backup fuzz target as a multiplication overflow; a
    /// release build wrote the page over guest page 0).
    #[test]
    fn a_page_far_past_ram_is_refused_not_wrapped_into_it() {
        let ram = GuestRam::new(RAM_BASE, 16 << 20).unwrap();
        let base = RAM_BASE / PAGE_SIZE as u64;
        let mut enc = page_delta::PageEncoder::new(4);
        let far = base + (1 << 52);
        let blob = enc.encode(&[far], &[0xcd; PAGE_SIZE]);
        match decode_pages(&ram, 3, &blob) {
            Err(PeerError::Pages { number: 3, source: page_delta::DecodeError::PfnOutOfRange { pfn } }) => {
                assert_eq!(pfn, far)
            }
            other => panic!("{:?}", other.map(|p| p.len())),
        }
        // The last page of RAM is in; the one after it is not.
        let last = base + (16 << 20) / PAGE_SIZE as u64 - 1;
        assert_eq!(decode_pages(&ram, 0, &enc.encode(&[last], &[1; PAGE_SIZE])).unwrap()[0].0, last);
        assert!(decode_pages(&ram, 0, &enc.encode(&[last + 1], &[1; PAGE_SIZE])).is_err());
    }

    /// A TCP segment with `payload` from the guest's port 6379 to `port`.
    fn segment(port: u16, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4([10, 0, 0, 2], [10, 0, 0, 9], 64)
            .tcp(6379, port, 1000, 65535)
            .ack(77)
            .write(&mut out, payload)
            .unwrap();
        out
    }

    /// A stream cut after checkpoint 1: the frames received toward
    /// checkpoint 2 are what the guest resumed at 1 never had, and the
    /// last segment of each connection sent up to 1 is sent again; what
    /// was received toward a committed checkpoint, and the segments of the
    /// checkpoint that never came whole, are not.
    #[test]
    fn going_live_gives_the_frames_after_the_last_commit_and_sends_the_last_segments_up_to_it() {
        let mut enc = page_delta::PageEncoder::new(4);
        let mut stream = Vec::new();
        let state = zstd::bulk::compress(b"state", 1).unwrap();
        let mut put = |r: Record| ftvm_replication::checkpoint_stream::write(&mut stream, &r).unwrap();
        let checkpoint = |number: u64, enc: &mut page_delta::PageEncoder| Record::Checkpoint {
            number,
            icount: number * 1000,
            state: state.clone(),
            pages: enc.encode(&[], &[]),
        };
        put(Record::Received { number: 0, slot: 0, frame: b"had at 0".to_vec() });
        put(checkpoint(0, &mut enc));
        put(Record::Received { number: 1, slot: 0, frame: b"had at 1".to_vec() });
        put(Record::Sent { number: 1, slot: 0, frame: segment(40000, b"+OK") });
        put(Record::Sent { number: 1, slot: 0, frame: segment(40001, b":1") });
        put(checkpoint(1, &mut enc));
        put(Record::Received { number: 2, slot: 1, frame: b"never had".to_vec() });
        put(Record::Sent { number: 2, slot: 0, frame: segment(40000, b"held") });
        put(Record::Received { number: 2, slot: 0, frame: b"nor this".to_vec() });
        let mut held = Committed::new(1 << 20).unwrap();
        let mut disks = Disks::open(&[], Events::default()).unwrap();
        let followed = follow(&stream[..], &mut held, &mut disks, |_| {}).unwrap();
        assert!(matches!(followed, Followed::Cut));
        assert_eq!(held.number, 1);
        let (resend, undelivered) = held.take_frames();
        assert_eq!(undelivered, vec![(1, b"never had".to_vec()), (0, b"nor this".to_vec())]);
        let mut resend: Vec<_> = resend.into_iter().map(|(_, f)| f).collect();
        resend.sort();
        let mut want = vec![segment(40000, b"+OK"), segment(40001, b":1")];
        want.sort();
        assert_eq!(resend, want);
    }
}
