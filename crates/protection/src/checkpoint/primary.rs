//! The primary's side of checkpoint mode (Remus, ../../../../shared/seeds/remus.txt
//! §2.2-§2.5), as the live loop sees it. Every interval the loop stops
//! the machine at an instruction boundary and hands this module the
//! checkpoint: the pages written since the last one are copied into a
//! staging buffer with the machine's state, and the guest runs on at once
//! (speculative execution) while a sender thread compresses the pages
//! (`page_delta`) and writes the checkpoint into the channel.
//!
//! Output commit (§2.4): frames the guest sends during interval k wait
//! behind a barrier until the backup has acknowledged checkpoint k; they
//! cost the guest nothing meanwhile (a sent frame needs no completion).
//! Unlike Remus, an interval with frames waiting ends early when the guest
//! idles: an answered request then leaves within a few milliseconds
//! rather than at the end of the interval.
//! Disk writes go to this host's copy at once and are mirrored into the
//! stream, ahead of the checkpoint of their interval (§2.5); the backup
//! applies them when that checkpoint commits.
//!
//! Nothing here needs determinism: the backup never executes.

use crate::control::ControlEntry;
use crate::error::{file, PeerError, ProtectionError};
use crate::events::Events;
use crate::events::PairEvent;
use crate::primary::{
    apply_control, await_claim, backup_lost, protection_stopped, Alone, HandOver, Primary, Request, END_ACK_WAIT,
    HAND_OVER_WAIT,
};
use crate::resend::LastSegments;
use crate::status::{CheckpointStatus, PairStatus, PauseBucket, PrimaryMode, PrimaryStatus};
use ftvm_machine::{BlkOp, Engine, Event, IoCompletion, IoRequest};
use ftvm_replication::arbiter::Arbiter;
use ftvm_replication::channel::{Failure, LogSender, SenderWatch};
use ftvm_replication::checkpoint_stream::{self as stream, Record};
use ftvm_replication::disk_sync::{self, DigestList};
use ftvm_replication::output_rule::OutputGate;
use ftvm_replication::page_delta::{DeltaStats, PageEncoder, PAGE_SIZE};
use std::collections::VecDeque;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Pages of the last version sent that the sender remembers, to send the
/// next version as a delta (Remus §3.4): 64 MiB, the working set of a
/// busy guest between checkpoints with room to spare.
const PAGE_CACHE: usize = 16384;
/// Checkpoints (with the disk writes between them) staged but not yet
/// written into the channel before the machine waits for the sender: the
/// guest may run ahead of the backup by a few intervals, not without bound.
const STAGED: usize = 3;
/// Most pages compressed into one record: a large checkpoint goes in
/// pieces, so the channel never falls silent for long (8 MiB of pages
/// take some tens of milliseconds to compress when none are cached).
const PAGES_PER_RECORD: usize = 2048;
/// Pause times kept for the median and p99 in status.
const PAUSES_KEPT: usize = 4096;
/// Least time between an idle checkpoint and the checkpoint before it: a
/// guest answering many small requests gets at most 500 extra checkpoints
/// a second, each a pause of some tens of microseconds.
const IDLE_GAP: Duration = Duration::from_millis(2);
/// How long the sender waits for a job before it shows the backup the
/// primary is alive (the heartbeat interval of the default timing).
const KEEP_ALIVE: Duration = Duration::from_millis(50);

/// Before the first checkpoint: the blocks of this host's disks (`disks`:
/// slot, path and digest, taken before the guest started) that the
/// backup's copies lack, as it asked with the digests of its own copies
/// (Remus §2.5: the copies start the same). Returns the blocks and bytes
/// sent. Their digests were taken ahead, so the stream flows from the
/// moment the backup is ready: a silent channel would look like a failure.
pub fn send_disk_blocks(
    channel: &mut LogSender,
    disks: &[(usize, std::path::PathBuf, crate::pair::DiskDigest)],
) -> Result<(usize, u64), ProtectionError> {
    let requests = channel.take_requests();
    send_differing_blocks(channel, requests, disks)
}

/// The blocks of this host's disk at `path` (digest `mine`) whose
/// digests differ from the backup's (`theirs`), as disk-sync records.
fn send_blocks(
    channel: &mut LogSender,
    theirs: &DigestList,
    path: &std::path::Path,
    mine: &crate::pair::DiskDigest,
) -> Result<(usize, u64), ProtectionError> {
    let (mut blocks, mut bytes) = (0, 0);
    let mut out = Vec::new();
    let f = std::fs::File::open(path).map_err(file("cannot read disk", path))?;
    for (offset, len) in theirs.differing(&mine.blocks) {
        let mut data = vec![0u8; len];
        disk_sync::read_zero_padded(&f, &mut data, offset).map_err(file("cannot read disk", path))?;
        out.clear();
        stream::encode(&mut out, &Record::DiskSync { slot: theirs.slot, offset, data });
        channel
            .write_all(&out)
            .map_err(|source| ProtectionError::Channel { doing: "sending the backup its disk blocks", source })?;
        blocks += 1;
        bytes += len as u64;
    }
    Ok((blocks, bytes))
}

/// For each of the backup's requests (the digests of its copy of a disk)
/// the blocks of this host's disk (`disks`: slot, path, digest) that
/// differ. For a running VM (checkpoint mode's transfer) the digests were
/// taken once its writes went into the stream: a write that lands while
/// the blocks are read is sent again as a disk write, applied after them
/// with checkpoint 0.
fn send_differing_blocks(
    channel: &mut LogSender,
    requests: Vec<Vec<u8>>,
    disks: &[(usize, std::path::PathBuf, crate::pair::DiskDigest)],
) -> Result<(usize, u64), ProtectionError> {
    let (mut blocks, mut bytes) = (0, 0);
    for request in requests {
        let theirs = DigestList::decode(&request).map_err(PeerError::BlockRequest)?;
        let Some((slot, path, mine)) = disks.iter().find(|(slot, _, _)| *slot as u64 == u64::from(theirs.slot)) else {
            return Err(PeerError::RequestSlot(theirs.slot).into());
        };
        if theirs.size != mine.size {
            return Err(PeerError::RequestSize { size: theirs.size, slot: *slot }.into());
        }
        let (b, n) = send_blocks(channel, &theirs, path, mine)?;
        blocks += b;
        bytes += n;
    }
    channel.send_now();
    Ok((blocks, bytes))
}

enum Job {
    Write {
        slot: u32,
        offset: u64,
        data: Vec<u8>,
    },
    /// Pages of a running VM sent ahead of its first checkpoint (a
    /// pre-copy round's share), as the guest runs on.
    Pages {
        pfns: Vec<u64>,
        pages: Vec<u8>,
    },
    /// A running VM's disks made the same on the backup: its requests
    /// (the digests of its copies) and this host's disks, with their
    /// digests taken since its writes go into the stream (or why not).
    DiskSync {
        requests: Vec<Vec<u8>>,
        disks: Result<Vec<(usize, std::path::PathBuf, crate::pair::DiskDigest)>, ProtectionError>,
    },
    /// The stream goes on in another form (a replay log): the channel
    /// is handed back once all before it is written.
    Yield(mpsc::Sender<LogSender>),
    Checkpoint {
        number: u64,
        icount: u64,
        state: Vec<u8>,
        pfns: Vec<u64>,
        pages: Vec<u8>,
        /// The last segment of each connection among its frames, as
        /// (NIC slot, frame): written ahead of it (`Record::Sent`).
        sent: Vec<(usize, Vec<u8>)>,
    },
    End(Option<u32>),
    /// The stream ends in a handover (after a last checkpoint).
    HandOver,
    /// A control entry, in order with the rest.
    Control(Vec<u8>),
    /// A frame received toward a checkpoint (`Record::Received`).
    Received(Record),
}

/// What the sender thread reports back.
#[derive(Default)]
struct SenderReport {
    /// (interval, bytes of stream up to the end of its checkpoint), for the
    /// checkpoints whose acknowledgement has not been seen yet.
    ends: VecDeque<(u64, u64)>,
    delta: DeltaStats,
    /// Bytes of the checkpoint records written (pages and state).
    checkpoint_bytes: u64,
    checkpoints: u64,
}

/// Checkpoint-mode protection, the primary's side: takes the checkpoints,
/// hands them to the sender thread and holds each interval's frames.
pub struct Checkpointer {
    interval: Duration,
    due: Instant,
    /// Whether to checkpoint at once when the guest idles with frames
    /// waiting for their interval to end (see [`Checkpointer::idle_due`]).
    idle_checkpoints: bool,
    /// When the last checkpoint was taken, and how many were taken early
    /// because the guest idled.
    last: Instant,
    early: u64,
    /// The interval in progress: its checkpoint will carry this number.
    number: u64,
    /// Frames sent during the interval in progress.
    this_interval: Vec<(usize, IoRequest)>,
    /// Frames of finished intervals, tagged with the interval count that must be
    /// acknowledged (k + 1 for interval k).
    gate: OutputGate<(usize, IoRequest)>,
    /// Epochs whose checkpoints the backup has acknowledged.
    acked_checkpoints: u64,
    jobs: SyncSender<Job>,
    report: Arc<Mutex<SenderReport>>,
    /// Staging buffers the sender is done with, to use again.
    spare: Receiver<Vec<u8>>,
    ended: Receiver<()>,
    watch: SenderWatch,
    arbiter: Arbiter,
    me: String,
    events: Events,
    pauses: VecDeque<Duration>,
    dirty: VecDeque<usize>,
    started: Instant,
    rate_mark: (Instant, u64),
    rate: f64,
    /// When a handover stopped the guest.
    handing_over: Option<Instant>,
    /// Whether RAM went ahead of the first checkpoint (a running VM's
    /// pre-copy): it then carries only the pages written since.
    precopied: bool,
    /// Pre-copy shares handed to the sender and not yet written.
    precopy_queued: Arc<AtomicUsize>,
}

impl Checkpointer {
    /// Starts the sender thread on `channel` (the header already written).
    pub fn new(
        channel: LogSender,
        interval: Duration,
        idle_checkpoints: bool,
        arbiter: Arbiter,
        me: String,
        events: Events,
    ) -> Result<Checkpointer, ProtectionError> {
        let (jobs, rx) = mpsc::sync_channel::<Job>(STAGED);
        let (spare_tx, spare) = mpsc::channel();
        let (ended_tx, ended) = mpsc::channel();
        let report = Arc::new(Mutex::new(SenderReport::default()));
        let watch = channel.watch();
        let precopy_queued = Arc::new(AtomicUsize::new(0));
        {
            let report = report.clone();
            let queued = precopy_queued.clone();
            std::thread::Builder::new()
                .name("ft-checkpoint-send".into())
                .spawn(move || send_loop(channel, rx, report, spare_tx, ended_tx, queued))
                .map_err(|e| ProtectionError::Thread("checkpoint sender", e))?;
        }
        Ok(Checkpointer {
            interval,
            due: Instant::now(),
            idle_checkpoints,
            last: Instant::now(),
            early: 0,
            number: 0,
            this_interval: Vec::new(),
            gate: OutputGate::default(),
            acked_checkpoints: 0,
            jobs,
            report,
            spare,
            ended,
            watch,
            arbiter,
            me,
            events,
            pauses: VecDeque::new(),
            dirty: VecDeque::new(),
            started: Instant::now(),
            rate_mark: (Instant::now(), 0),
            rate: 0.0,
            handing_over: None,
            precopied: false,
            precopy_queued,
        })
    }

    /// A pre-copy begins: the machine's second view of the pages written
    /// ([`Engine::start_dirty_view`]) is started, and checkpoint 0 will
    /// carry what it saw since the last round rather than all of RAM.
    pub fn begin_precopy(&mut self, m: &mut dyn Engine) {
        self.precopied = true;
        m.set_dirty_tracking(true);
        m.start_dirty_view();
    }

    /// Pre-copy: sends the pages `pfns` of the running VM ahead of the
    /// first checkpoint, unless the sender is still busy with earlier
    /// ones (false: the guest runs on, and they are offered again later).
    /// The first checkpoint then carries the pages written since the
    /// pre-copy began ([`Engine::take_dirty_pages`] from then on).
    pub fn precopy(&mut self, m: &dyn Engine, pfns: &[u64]) -> bool {
        debug_assert!(self.precopied, "begin_precopy first");
        // One share in the sender's hands and one waiting keep it busy;
        // more would only hold copies of pages that may change again.
        if self.precopy_queued.load(Ordering::Acquire) >= 2 {
            return false;
        }
        let base_pfn = m.ram().base() / PAGE_SIZE as u64;
        let ram = m.ram().as_slice();
        let mut pages = self.spare.try_recv().unwrap_or_default();
        pages.clear();
        pages.reserve(pfns.len() * PAGE_SIZE);
        for &pfn in pfns {
            let off = ((pfn - base_pfn) as usize) * PAGE_SIZE;
            pages.extend_from_slice(&ram[off..off + PAGE_SIZE]);
        }
        self.precopy_queued.fetch_add(1, Ordering::AcqRel);
        // A sender that stopped is a lost backup, reported by its own
        // event.
        let _ = self.jobs.send(Job::Pages { pfns: pfns.to_vec(), pages });
        true
    }

    /// A running VM's disks made the same on the backup, ahead of the
    /// first checkpoint: its writes must be going into the stream already
    /// ([`Checkpointer::mirror_writes`]), and none issued before may still
    /// be in flight. This host's disks are hashed on a thread of their
    /// own (seconds for a large disk), so the guest's mirrored writes
    /// meanwhile do not wait for the sender; then the sender sends the
    /// blocks that differ (see `send_differing_blocks`).
    pub fn sync_disks(&mut self, requests: Vec<Vec<u8>>, disks: Vec<(usize, std::path::PathBuf)>) {
        self.precopy_queued.fetch_add(1, Ordering::AcqRel);
        let jobs = self.jobs.clone();
        let hash = move || {
            let sizes: Vec<(u64, u64)> = requests
                .iter()
                .filter_map(|r| DigestList::decode(r).ok())
                .map(|l| (u64::from(l.slot), l.size))
                .collect();
            let disks = disks
                .into_iter()
                .filter_map(|(slot, path)| {
                    let size = sizes.iter().find(|(s, _)| *s == slot as u64)?.1;
                    Some(crate::pair::DiskDigest::of(&path, Some(size)).map(|d| (slot, path, d)))
                })
                .collect();
            let _ = jobs.send(Job::DiskSync { requests, disks });
        };
        if let Err(e) = std::thread::Builder::new().name("ft-disk-digest".into()).spawn(hash) {
            let disks = Err(ProtectionError::Thread("disk digest", e));
            let _ = self.jobs.send(Job::DiskSync { requests: Vec::new(), disks });
        }
    }

    /// Disk writes among `requests` go into the stream, applied on the
    /// backup with the next checkpoint (all a running VM's pre-copy does
    /// with its requests: nothing else of protection applies yet).
    pub fn mirror_writes(&mut self, requests: &[Request]) {
        for (slot, req) in requests {
            if let IoRequest::Disk { op: BlkOp::Write { offset, data }, .. } = req {
                // A sender that stopped is a lost backup, reported by its
                // own event.
                let _ = self.jobs.send(Job::Write { slot: *slot as u32, offset: *offset, data: data.clone() });
            }
        }
    }

    /// Bytes written into the channel so far, and acknowledged.
    pub fn stream_bytes(&self) -> (u64, u64) {
        (self.watch.written(), self.watch.acked())
    }

    /// The channel, once everything staged before is written into it:
    /// the stream goes on as a replay log from here (a running VM given a
    /// lockstep or epoch backup, after its first checkpoint).
    pub fn into_channel(self) -> Result<(LogSender, Arbiter), ProtectionError> {
        let (tx, rx) = mpsc::channel();
        let gone = || ProtectionError::Channel {
            doing: "handing the channel from the transfer to the log",
            source: std::io::Error::other("the checkpoint sender stopped"),
        };
        self.jobs.send(Job::Yield(tx)).map_err(|_| gone())?;
        let channel = rx.recv().map_err(|_| gone())?;
        Ok((channel, self.arbiter))
    }

    /// Waits (up to `wait`) until the backup has acknowledged checkpoint
    /// `number`: false if it did not in time.
    pub fn wait_checkpoint_acked(&mut self, number: u64, wait: Duration) -> bool {
        let until = Instant::now() + wait;
        loop {
            // Frames of acknowledged checkpoints become releasable here;
            // none are held before a running VM's pair starts.
            let released = self.release();
            debug_assert!(released.is_empty());
            if self.acked_checkpoints > number {
                return true;
            }
            if self.watch.failure().is_some() || Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Records at the arbiter that this pair has started (see
    /// `Arbiter::mark_started`).
    pub fn mark_started(&self) -> Result<(), ProtectionError> {
        Ok(self.arbiter.mark_started()?)
    }

    /// The pair's generation at the arbiter.
    pub fn generation(&self) -> u64 {
        self.arbiter.generation()
    }

    /// The channel to the backup.
    pub fn watch(&self) -> &SenderWatch {
        &self.watch
    }

    /// The fence the channel's acknowledgements renew.
    pub fn fence(&self) -> ftvm_replication::fence::Fence {
        self.watch.fence()
    }

    /// Whether the channel has failed.
    pub fn failed(&self) -> bool {
        self.watch.failure().is_some()
    }

    /// Whether to take a checkpoint now, before it is due, because every
    /// hart idles while frames of this interval wait for it: a request has
    /// been answered and the guest has nothing more to do, so holding the
    /// reply for the rest of the interval would only add latency (Remus
    /// holds it; on a request-response load that is most of the added
    /// latency). At most one every [`IDLE_GAP`].
    pub fn idle_due(&self, now: Instant) -> bool {
        self.idle_checkpoints && !self.this_interval.is_empty() && now >= self.last + IDLE_GAP
    }

    /// The machine's new requests: frames wait for the end of their interval
    /// and its acknowledgement, disk writes are mirrored to the backup;
    /// the rest, and what the acknowledgements let go, are returned.
    fn hold_frames(&mut self, requests: Vec<Request>) -> Vec<Request> {
        self.mirror_writes(&requests);
        let mut now = Vec::new();
        for (slot, req) in requests {
            match &req {
                IoRequest::NetTx { .. } => self.this_interval.push((slot, req)),
                _ => now.push((slot, req)),
            }
        }
        let mut out = self.release();
        out.extend(now);
        out
    }

    /// Frames whose checkpoints the backup has acknowledged.
    fn release(&mut self) -> Vec<(usize, IoRequest)> {
        let acked = self.watch.acked();
        {
            let mut r = self.report.lock().unwrap();
            while let Some(&(number, end)) = r.ends.front() {
                if end > acked {
                    break;
                }
                self.acked_checkpoints = number + 1;
                r.ends.pop_front();
            }
        }
        self.gate.release(self.acked_checkpoints, 0)
    }

    /// Ends the interval in progress with its checkpoint: the machine is
    /// stopped at an instruction boundary with its requests taken. The
    /// first checkpoint carries every page that is not zero (after a
    /// pre-copy, those written since it began). Returns the pages it
    /// carries.
    pub fn checkpoint(&mut self, m: &mut dyn Engine) -> Result<usize, ProtectionError> {
        let t0 = Instant::now();
        // After a pre-copy, checkpoint 0 carries the pages its view saw
        // written since the last round.
        let dirty = if self.number == 0 && self.precopied {
            let pages = m.take_dirty_view();
            m.end_dirty_view();
            pages
        } else {
            m.take_dirty_pages()
        };
        let base_pfn = m.ram().base() / PAGE_SIZE as u64;
        let ram = m.ram().as_slice();
        let page = PAGE_SIZE;
        let pfns: Vec<u64> = if self.number == 0 && !self.precopied {
            let zero = [0u8; PAGE_SIZE];
            ram.chunks_exact(page)
                .enumerate()
                .filter(|(_, p)| *p != zero.as_slice())
                .map(|(i, _)| base_pfn + i as u64)
                .collect()
        } else {
            dirty
        };
        let mut pages = self.spare.try_recv().unwrap_or_default();
        pages.clear();
        pages.reserve(pfns.len() * page);
        for &pfn in &pfns {
            let off = ((pfn - base_pfn) as usize) * page;
            pages.extend_from_slice(&ram[off..off + page]);
        }
        let state = m.checkpoint_state()?;
        let pause = t0.elapsed();
        let n = pfns.len();
        if self.number == 0 && !self.precopied {
            eprintln!(
                "ftvm: first checkpoint: {n} pages of RAM in use ({} MiB), copied in {} ms",
                (n * PAGE_SIZE) >> 20,
                pause.as_millis()
            );
        }
        // Ahead of it, the last segment of each connection among the
        // frames it holds: what the backup sends again if it goes live
        // from this checkpoint (`Record::Sent`).
        let mut last = LastSegments::default();
        for (slot, req) in &self.this_interval {
            if let IoRequest::NetTx { frame } = req {
                last.saw(*slot, frame);
            }
        }
        let sent = last.recent();
        let _ = self.jobs.send(Job::Checkpoint { number: self.number, icount: m.icount(), state, pfns, pages, sent });
        // The wait for a busy sender is part of the pause the guest sees.
        let pause = pause.max(t0.elapsed());
        for out in self.this_interval.drain(..) {
            self.gate.hold(self.number + 1, out);
        }
        self.number += 1;
        // On the configured beat, not an interval after this one: the
        // checks between machine chunks would otherwise stretch every
        // interval a little. A late checkpoint does not make a burst; an
        // early one (the guest idled) leaves the beat where it was.
        if t0 >= self.due {
            self.due = (self.due + self.interval).max(Instant::now());
        } else {
            self.early += 1;
        }
        self.last = t0;
        if self.pauses.len() == PAUSES_KEPT {
            self.pauses.pop_front();
            self.dirty.pop_front();
        }
        self.pauses.push_back(pause);
        self.dirty.push_back(n);
        Ok(n)
    }

    /// Whether the sender has written every pre-copy share handed to it.
    pub fn precopy_done(&self) -> bool {
        self.precopy_queued.load(Ordering::Acquire) == 0
    }

    /// The VM ends: a last checkpoint (the outputs of the last interval wait
    /// for it), the end mark, and its acknowledgement, so the backup does
    /// not take the primary's exit for a failure. Returns what may leave.
    fn end_stream(&mut self, m: &mut dyn Engine, status: Option<u32>) -> Vec<Request> {
        if self.watch.failure().is_none() {
            if let Err(e) = self.checkpoint(m) {
                eprintln!("ftvm: {e}");
            }
            let _ = self.jobs.send(Job::End(status));
            if self.ended.recv_timeout(END_ACK_WAIT).is_err() {
                eprintln!("ftvm: the backup did not acknowledge the end of the VM");
                return Vec::new();
            }
        }
        let mut out = self.release();
        // Acknowledged or not, an ending VM's last frames go: the backup
        // saw the end, or is gone.
        out.extend(self.gate.release_all());
        out
    }

    /// A handover's first step: a last checkpoint of the stopped guest,
    /// and the wait for its acknowledgement, which lets every held frame go.
    fn hand_over_frames(&mut self, m: &mut dyn Engine) -> Result<Vec<Request>, ProtectionError> {
        let started = Instant::now();
        self.handing_over = Some(started);
        self.events.emit(PairEvent::HandingOver {
            backup: self.watch.peer().to_string(),
            generation: self.arbiter.generation(),
        });
        eprintln!("ftvm: handing the VM over to the backup at {}", self.watch.peer());
        self.checkpoint(m)?;
        let mut out = Vec::new();
        loop {
            out.extend(self.release());
            // A failed backup, or one that does not catch up, is the
            // second step's to handle.
            if self.gate.is_empty() || self.watch.failure().is_some() || started.elapsed() >= HAND_OVER_WAIT {
                return Ok(out);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// A handover's second step: a checkpoint of what came in since the
    /// first (the machine did not run, but inputs went in), the stream's
    /// handover mark, then the wait for the backup's claim.
    fn hand_over_stream_end(&mut self, m: &mut dyn Engine) -> Result<HandOver, ProtectionError> {
        let since = self.handing_over.take().unwrap_or_else(Instant::now);
        let mark_sent = self.watch.failure().is_none();
        if mark_sent {
            if !self.gate.is_empty() {
                return Err(ProtectionError::HandOverTimedOut(HAND_OVER_WAIT));
            }
            self.checkpoint(m)?;
            let _ = self.jobs.send(Job::HandOver);
            // Not acknowledged in time: the claim's wait decides.
            let _ = self.ended.recv_timeout(HAND_OVER_WAIT);
        }
        let fence = self.watch.fence();
        let watch = &self.watch;
        let (gate, this_interval) = (&mut self.gate, &mut self.this_interval);
        let held = || {
            let mut out = gate.release_all();
            out.append(this_interval);
            out
        };
        await_claim(&self.arbiter, &self.me, &self.events, &fence, mark_sent, || watch.failure(), held, since)
    }

    /// Checkpoints taken on the beat of the interval (not early).
    fn on_beat(&self) -> u64 {
        self.number - self.early
    }

    /// Status fields for the control socket: configured and achieved
    /// rates (of the checkpoints on the beat; `idle_checkpoints` counts
    /// the early ones), pause times against pages dirtied, bytes per checkpoint,
    /// compression, outputs held.
    fn pair_status(&mut self) -> PairStatus {
        let r = self.report.lock().unwrap();
        let now = Instant::now();
        let dt = now.duration_since(self.rate_mark.0).as_secs_f64();
        if dt >= 0.5 {
            self.rate = (self.on_beat() - self.rate_mark.1) as f64 / dt;
            self.rate_mark = (now, self.on_beat());
        }
        let mut sorted: Vec<Duration> = self.pauses.iter().copied().collect();
        sorted.sort();
        let pct = |p: f64| sorted.get(((sorted.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or_default();
        let mut dirty: Vec<usize> = self.dirty.iter().copied().collect();
        dirty.sort();
        let dirty_median = dirty.get(dirty.len() / 2).copied().unwrap_or(0);
        // Remus's Fig. 5: pause time against pages dirtied, as the median
        // and p99 pause of the checkpoints in each decade of dirty pages.
        let mut pause_by_dirty = Vec::new();
        for (lo, hi) in [(0, 10), (10, 100), (100, 1000), (1000, 10_000), (10_000, usize::MAX)] {
            let mut p: Vec<Duration> =
                self.dirty.iter().zip(&self.pauses).filter(|(d, _)| (lo..hi).contains(*d)).map(|(_, p)| *p).collect();
            if p.is_empty() {
                continue;
            }
            p.sort();
            pause_by_dirty.push(PauseBucket {
                lo: lo as u64,
                hi: (hi != usize::MAX).then(|| hi as u64 - 1),
                median_us: p[p.len() / 2].as_micros() as u64,
                p99_us: p[(p.len() - 1) * 99 / 100].as_micros() as u64,
                checkpoints: p.len() as u64,
            });
        }
        let status = CheckpointStatus {
            interval_ms: self.interval.as_millis() as u64,
            checkpoints: self.number,
            idle_checkpoints: self.idle_checkpoints.then_some(self.early),
            rate: self.rate,
            rate_overall: self.on_beat() as f64 / self.started.elapsed().as_secs_f64().max(1e-9),
            committed: self.acked_checkpoints,
            pause_median_us: pct(0.5).as_micros() as u64,
            pause_p99_us: pct(0.99).as_micros() as u64,
            dirty_median: dirty_median as u64,
            pause_by_dirty,
            bytes_per_checkpoint: r.checkpoint_bytes / r.checkpoints.max(1),
            compression: r.delta.ratio(),
            log_bytes: self.watch.sent(),
            acked: self.watch.acked(),
            held: (self.gate.len() + self.this_interval.len()) as u64,
            outputs_held_total: self.gate.total_held() + self.this_interval.len() as u64,
        };
        PairStatus::Primary(PrimaryStatus::of(&self.watch, self.arbiter.generation(), PrimaryMode::Checkpoint(status)))
    }
}

impl<E: Engine> Primary<E> for Checkpointer {
    /// A checkpoint carries the state itself: the harts may run in
    /// parallel between checkpoints.
    fn needs_determinism(&self) -> bool {
        false
    }

    fn before_run(&mut self, _m: &mut E, _paused: bool) -> Result<(), ProtectionError> {
        Ok(())
    }

    /// A received frame goes to the backup at once as well: if this side
    /// dies before the interval's checkpoint is acknowledged, the backup
    /// resumes from a checkpoint whose guest never had it, and gives it
    /// to the guest as it goes live rather than leave the client to send
    /// it again at its retransmission timer. Dropped if the sender is
    /// behind: it only saves time, and the guest must not wait for it.
    fn input(&mut self, _icount: u64, ev: Event) -> Option<Event> {
        if let Event::Io { slot, completion: IoCompletion::NetRx { frame } } = &ev {
            let record = Record::Received { number: self.number, slot: *slot as u32, frame: frame.clone() };
            let _ = self.jobs.try_send(Job::Received(record));
        }
        Some(ev)
    }

    fn gate(&mut self, requests: Vec<Request>, _icount: u64) -> Vec<Request> {
        self.hold_frames(requests)
    }

    /// The checkpoint, when one is due.
    fn after_slice(&mut self, m: &mut E, _busy: Duration, idle: bool) -> Result<Duration, ProtectionError> {
        let now = Instant::now();
        if now >= self.due || (idle && self.idle_due(now)) {
            self.checkpoint(m)?;
        }
        Ok(Duration::ZERO)
    }

    /// Checkpoints go on while the guest sleeps: they are what shows the
    /// backup the primary is alive.
    fn wake_within(&self, now: Instant) -> Option<Duration> {
        Some(self.due.saturating_duration_since(now))
    }

    fn may_pause(&self) -> bool {
        false
    }

    fn peer_lost(&mut self, failure: &Failure) -> Result<Alone, ProtectionError> {
        let fence = self.watch.fence();
        let outputs = backup_lost(&self.arbiter, &self.me, failure, &self.events, &fence, || {
            let mut out = self.gate.release_all();
            out.append(&mut self.this_interval);
            out
        })?;
        Ok(Alone { outputs, inputs: Vec::new() })
    }

    fn hand_over(&mut self, m: &mut E) -> Result<Vec<Request>, ProtectionError> {
        self.hand_over_frames(m)
    }

    fn stream_failed(&self) -> bool {
        self.watch.failure().is_some()
    }

    /// The entry goes at once, between checkpoints: the backup takes it
    /// as it reads it.
    fn control(&mut self, _m: &mut E, entry: ControlEntry) -> Result<(), ProtectionError> {
        apply_control(&self.watch, entry, &self.events);
        self.jobs.send(Job::Control(entry.encode())).map_err(|_| ProtectionError::NoBackupToControl)
    }

    /// A last checkpoint (the frames of this interval wait for it), then
    /// the end, as at the VM's end.
    fn unprotect(mut self: Box<Self>, m: &mut E) -> Result<Alone, ProtectionError> {
        let acknowledged = self.watch.failure().is_none() && {
            self.checkpoint(m)?;
            let _ = self.jobs.send(Job::End(None));
            self.ended.recv_timeout(END_ACK_WAIT).is_ok()
        };
        let fence = self.watch.fence();
        let (gate, this_interval) = (&mut self.gate, &mut self.this_interval);
        let held = || {
            let mut out = gate.release_all();
            out.append(this_interval);
            out
        };
        let outputs = protection_stopped(acknowledged, &self.arbiter, &self.me, &self.events, &fence, held)?;
        Ok(Alone { outputs, inputs: Vec::new() })
    }

    fn hand_over_end(&mut self, m: &mut E) -> Result<HandOver, ProtectionError> {
        self.hand_over_stream_end(m)
    }

    fn status(&mut self) -> Option<PairStatus> {
        Some(self.pair_status())
    }

    fn end(&mut self, m: &mut E, status: Option<u32>) -> Vec<Request> {
        self.end_stream(m, status)
    }

    fn finish(self: Box<Self>, _m: &mut E, _status: Option<u32>) -> Result<(), ProtectionError> {
        Ok(())
    }
}

/// The sender thread: compresses and writes what the machine's thread
/// staged, in order, and notes where each checkpoint ends in the stream.
fn send_loop(
    mut channel: LogSender,
    jobs: Receiver<Job>,
    report: Arc<Mutex<SenderReport>>,
    spare: mpsc::Sender<Vec<u8>>,
    ended: mpsc::Sender<()>,
    precopy_queued: Arc<AtomicUsize>,
) {
    // Woken for every checkpoint, this thread would otherwise preempt the
    // machine's thread on a shared core and lengthen the very pause it is
    // there to shorten: SCHED_BATCH keeps its share but waits its turn.
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: plain system call on the calling thread with a valid param.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    let mut encoder = PageEncoder::new(PAGE_CACHE);
    let mut buf = Vec::new();
    loop {
        // The machine's thread may be busy for longer than the failure
        // timeout between two jobs (the first checkpoint scans all of
        // RAM): the channel must not fall silent meanwhile.
        let job = match jobs.recv_timeout(KEEP_ALIVE) {
            Ok(job) => job,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                buf.clear();
                stream::encode(&mut buf, &Record::KeepAlive);
                if channel.write_all(&buf).is_err() {
                    return;
                }
                channel.send_now();
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        buf.clear();
        match job {
            Job::Write { slot, offset, data } => stream::encode(&mut buf, &Record::DiskWrite { slot, offset, data }),
            Job::Control(entry) => stream::encode(&mut buf, &Record::Control(entry)),
            Job::Received(record) => {
                stream::encode(&mut buf, &record);
                if channel.write_all(&buf).is_err() {
                    return;
                }
                // Worth anything only if it is out before this side dies.
                channel.send_now();
                continue;
            }
            Job::Pages { pfns, pages } => {
                for (i, pfns) in pfns.chunks(PAGES_PER_RECORD).enumerate() {
                    let at = i * PAGES_PER_RECORD * PAGE_SIZE;
                    let blob = encoder.encode(pfns, &pages[at..at + pfns.len() * PAGE_SIZE]);
                    buf.clear();
                    stream::encode(&mut buf, &Record::Pages { number: 0, pages: blob });
                    if channel.write_all(&buf).is_err() {
                        return;
                    }
                    channel.send_now();
                    report.lock().unwrap().checkpoint_bytes += buf.len() as u64;
                }
                let _ = spare.send(pages);
                precopy_queued.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            Job::DiskSync { requests, disks } => {
                match disks.and_then(|disks| send_differing_blocks(&mut channel, requests, &disks)) {
                    Ok((blocks, bytes)) => eprintln!(
                        "ftvm: sent the backup {blocks} blocks ({:.1} MiB) its copies of the disks lacked",
                        bytes as f64 / (1 << 20) as f64
                    ),
                    Err(e) => {
                        // The backup sees the stream end before its first
                        // checkpoint, and the attempt fails on both sides.
                        eprintln!("ftvm: cannot make the backup's disks the same: {e}");
                        channel.close();
                        return;
                    }
                }
                precopy_queued.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            Job::Yield(to) => {
                let _ = to.send(channel);
                return;
            }
            Job::Checkpoint { number, icount, state, pfns, pages, sent } => {
                for (slot, frame) in sent {
                    buf.clear();
                    stream::encode(&mut buf, &Record::Sent { number, slot: slot as u32, frame });
                    if channel.write_all(&buf).is_err() {
                        return;
                    }
                }
                let mut written = 0;
                let pieces = pfns.len().div_ceil(PAGES_PER_RECORD).max(1);
                let mut blob = Vec::new();
                for (i, pfns) in pfns.chunks(PAGES_PER_RECORD).enumerate() {
                    let data = &pages[written * PAGE_SIZE..(written + pfns.len()) * PAGE_SIZE];
                    written += pfns.len();
                    blob = encoder.encode(pfns, data);
                    if i + 1 < pieces {
                        buf.clear();
                        stream::encode(&mut buf, &Record::Pages { number, pages: std::mem::take(&mut blob) });
                        if channel.write_all(&buf).is_err() {
                            return;
                        }
                        channel.send_now();
                        report.lock().unwrap().checkpoint_bytes += buf.len() as u64;
                    }
                }
                if pfns.is_empty() {
                    blob = encoder.encode(&[], &[]);
                }
                let _ = spare.send(pages);
                buf.clear();
                // The state is mostly device rings and registers that
                // barely change: zstd takes it to a fraction.
                let state = zstd::bulk::compress(&state, 1).expect("zstd compresses in memory");
                stream::encode(&mut buf, &Record::Checkpoint { number, icount, state, pages: blob });
                if channel.write_all(&buf).is_err() {
                    return;
                }
                channel.send_now();
                let mut r = report.lock().unwrap();
                r.ends.push_back((number, channel.written()));
                r.delta = encoder.stats();
                r.checkpoint_bytes += buf.len() as u64;
                r.checkpoints += 1;
                continue;
            }
            Job::End(_) | Job::HandOver => {
                let record = match job {
                    Job::End(status) => Record::End { status },
                    _ => Record::HandOver,
                };
                stream::encode(&mut buf, &record);
                if channel.write_all(&buf).is_err() {
                    return;
                }
                if channel.wait_acked(channel.written(), END_ACK_WAIT) {
                    let _ = ended.send(());
                }
                return;
            }
        }
        if channel.write_all(&buf).is_err() {
            return;
        }
    }
}
