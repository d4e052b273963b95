//! Disk images on the host and the threads that do disk I/O for the guest.
//!
//! * [`DiskImage`]: a raw image file (or block device), opened and locked
//!   with flock(2) so two VMs cannot write one image.
//! * [`FileBackend`]: the [`BlockBackend`] over such a file, with positioned
//!   I/O so any number of threads can share the file without a seek
//!   position.
//! * [`DiskWorkers`]: a small pool of threads that executes the disk
//!   requests of one virtio slot and reports each completion through a
//!   callback. The machine thread only queues work; it never waits on a
//!   disk. A pool may be given a latency: every request then takes at
//!   least that long, which models a slower disk than the host's (QEMU's
//!   null-co driver has `latency-ns` for the same purpose), so benchmarks
//!   can put the guest on a disk like the one a paper measured.

use std::collections::{BTreeSet, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ftvm_devices::virtio::blk::{execute, BlkOp, BlockBackend, SECTOR_SIZE};
use ftvm_devices::IoCompletion;

use crate::describe;

/// Why a disk image could not be opened. Each message names the disk.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("cannot open disk {}: {}", .path.display(), describe(.source))]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot use disk {}: it is a directory", .path.display())]
    IsDirectory { path: PathBuf },
    #[error("cannot use disk {}: not a regular file or block device", .path.display())]
    NotFileOrDevice { path: PathBuf },
    /// The lock is held: another VM has the image open for writing, or
    /// (for a writable open) for reading.
    #[error("disk {} is in use by another VM", .path.display())]
    InUse { path: PathBuf },
    #[error("cannot lock disk {}: {}", .path.display(), describe(.source))]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot size disk {}: {}", .path.display(), describe(.source))]
    Size {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("disk {} is too small: {size} bytes, at least {SECTOR_SIZE} needed", .path.display())]
    TooSmall { path: PathBuf, size: u64 },
}

/// Threads per disk unless configured otherwise: enough to overlap a few
/// requests on an SSD or a network filesystem without a crowd of threads.
pub const DEFAULT_DISK_THREADS: usize = 4;

/// An open, locked disk image.
///
/// The lock is flock(2) on the open file: exclusive for a writable image,
/// shared for a read-only one, so any number of VMs may read one base image
/// while none writes it. The lock lives as long as the file (and every
/// [`FileBackend`] cloned from it) stays open.
#[derive(Debug)]
pub struct DiskImage {
    path: PathBuf,
    file: File,
    size: u64,
    readonly: bool,
    /// Opened by [`DiskImage::open_taking_over`] while another process
    /// still held the lock, which is taken as soon as it lets go.
    taken_over: bool,
}

/// How an image is opened with respect to its lock.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Locking {
    /// Take it, or fail if another VM holds it.
    Take,
    /// Leave it (a backup reading beside its writer).
    Skip,
    /// Take it if free, and otherwise as soon as it is freed, in the
    /// background, opening the image meanwhile.
    TakeOver,
}

impl DiskImage {
    /// Opens and locks the image at `path`. Regular files and block devices
    /// are accepted; an image needs at least one 512-byte sector.
    pub fn open(path: &Path, readonly: bool) -> Result<DiskImage, DiskError> {
        Self::open_with(path, readonly, Locking::Take)
    }

    /// Opens the image writable for a fault-tolerant backup that won the
    /// arbiter: the primary it replaces may still hold the lock (stopped,
    /// or on its way to halting), but it is fenced and will write nothing
    /// more, so the winner does not wait for it. The lock is taken as
    /// soon as the old primary lets go, keeping other VMs out from then
    /// on. (Waiting for it instead left no VM serving when the old
    /// primary stayed stopped.)
    pub fn open_taking_over(path: &Path) -> Result<DiskImage, DiskError> {
        Self::open_with(path, false, Locking::TakeOver)
    }

    /// Whether the lock was still held elsewhere when this image was
    /// opened by [`DiskImage::open_taking_over`].
    pub fn taken_over(&self) -> bool {
        self.taken_over
    }

    /// Opens the image at `path` read-only without taking a lock: for a
    /// fault-tolerant backup reading the disk its primary holds and writes
    /// (VMware FT §4.2). That is safe only because the primary orders its
    /// writes after the backup's reads of the same blocks.
    pub fn open_beside_writer(path: &Path) -> Result<DiskImage, DiskError> {
        Self::open_with(path, true, Locking::Skip)
    }

    fn open_with(path: &Path, readonly: bool, locking: Locking) -> Result<DiskImage, DiskError> {
        let path_buf = || path.to_path_buf();
        let open_failed = |source| DiskError::Open { path: path_buf(), source };
        // O_NONBLOCK so that naming a FIFO fails below instead of hanging in
        // open(2) waiting for a writer; it means nothing for files and block
        // devices, and is cleared again once the type is known.
        let opened = OpenOptions::new().read(true).write(!readonly).custom_flags(libc::O_NONBLOCK).open(path);
        let file = opened.map_err(|e| match e.raw_os_error() {
            Some(libc::EISDIR) => DiskError::IsDirectory { path: path_buf() },
            _ => open_failed(e),
        })?;
        // Checked on the open file, not the path, so a rename in between
        // cannot slip something else in.
        let meta = file.metadata().map_err(open_failed)?;
        let ft = meta.file_type();
        if ft.is_dir() {
            return Err(DiskError::IsDirectory { path: path_buf() });
        }
        if !ft.is_file() && !ft.is_block_device() {
            return Err(DiskError::NotFileOrDevice { path: path_buf() });
        }
        set_blocking(&file).map_err(open_failed)?;
        let mut taken_over = false;
        if locking != Locking::Skip {
            match lock(&file, readonly) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && locking == Locking::TakeOver => {
                    // flock belongs to the open file description, which a
                    // duplicate shares: the thread's lock is the image's,
                    // held as long as the image is open.
                    let dup = file.try_clone().map_err(|e| DiskError::Lock { path: path_buf(), source: e })?;
                    std::thread::Builder::new()
                        .name("disk-lock".into())
                        .spawn(move || {
                            // SAFETY: flock on a descriptor this thread owns.
                            while unsafe { libc::flock(dup.as_raw_fd(), libc::LOCK_EX) } != 0
                                && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
                            {
                            }
                        })
                        .map_err(|e| DiskError::Lock { path: path_buf(), source: e })?;
                    taken_over = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(DiskError::InUse { path: path_buf() }),
                Err(e) => return Err(DiskError::Lock { path: path_buf(), source: e }),
            }
        }
        // Seeking to the end, unlike the metadata length, also sizes block
        // devices.
        let size = (&file).seek(SeekFrom::End(0)).map_err(|e| DiskError::Size { path: path_buf(), source: e })?;
        if size < SECTOR_SIZE {
            return Err(DiskError::TooSmall { path: path_buf(), size });
        }
        Ok(DiskImage { path: path.to_path_buf(), file, size, readonly, taken_over })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size in bytes; the guest sees the whole 512-byte sectors of it.
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn readonly(&self) -> bool {
        self.readonly
    }

    /// A backend sharing this image's open file (and so its lock).
    pub fn backend(&self) -> io::Result<FileBackend> {
        Ok(FileBackend::new(self.file.try_clone()?, self.size, self.readonly))
    }
}

fn set_blocking(file: &File) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own, with integer arguments only.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn lock(file: &File, shared: bool) -> io::Result<()> {
    let op = if shared { libc::LOCK_SH } else { libc::LOCK_EX };
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A [`BlockBackend`] over a file with positioned I/O.
///
/// The size is fixed when the image is opened: a transfer that does not lie
/// inside it fails instead of reading short or growing the file. A
/// read-only backend refuses every write, whatever the file descriptor
/// would allow.
#[derive(Debug)]
pub struct FileBackend {
    file: File,
    size: u64,
    readonly: bool,
}

impl FileBackend {
    pub fn new(file: File, size: u64, readonly: bool) -> Self {
        FileBackend { file, size, readonly }
    }

    pub fn readonly(&self) -> bool {
        self.readonly
    }

    fn inside(&self, offset: u64, len: usize) -> bool {
        offset.checked_add(len as u64).is_some_and(|end| end <= self.size)
    }
}

impl BlockBackend for FileBackend {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if !self.inside(offset, buf.len()) {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end of the disk"));
        }
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        if self.readonly {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "the disk is read-only"));
        }
        if !self.inside(offset, data.len()) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "write past the end of the disk"));
        }
        self.file.write_all_at(data, offset)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.readonly {
            // Nothing of ours can be dirty.
            return Ok(());
        }
        // Data only: the size never changes, and file times are not the
        // guest's business.
        self.file.sync_data()
    }
}

/// Called with `(slot, completion)` for each finished request.
type DoneFn = dyn Fn(usize, IoCompletion) + Send + Sync;

/// Threads executing the disk requests of one virtio slot.
///
/// Requests run concurrently and complete in any order, as virtio allows.
/// The one ordering guarantee: a flush starts only after every write
/// submitted before it has finished and its completion has been delivered,
/// so a flush makes durable at least everything the guest wrote before
/// asking for it. Writes submitted after a flush do not wait for it.
/// (Overlapping reads and writes in flight together are the guest's
/// business, as on real hardware.)
///
/// Dropping the pool lets requests already running finish (their
/// completions are still delivered), discards requests not yet started,
/// and joins the threads. Call [`DiskWorkers::drain`] first to have every
/// submitted request finish.
pub struct DiskWorkers {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

struct Shared {
    slot: usize,
    /// The least time from a worker taking a request to its completion.
    latency: Duration,
    state: Mutex<State>,
    /// Signalled when a job becomes available or runnable, or at stop.
    work: Condvar,
    /// Signalled when the pool has nothing queued and nothing running.
    idle: Condvar,
    done: Box<DoneFn>,
    /// Asked right before each write or flush reaches the disk (see
    /// [`DiskWorkers::fence_with`]).
    permit: std::sync::OnceLock<Permit>,
}

/// Whether the VM's outputs may reach the host now: waits until they may
/// (true) or never will again (false). A fault-tolerant primary's fence
/// (`ftvm_replication::fence`), asked at the last moment before a write
/// or flush, so one queued before its host stalled does not land after
/// the backup took over.
pub type Permit = Arc<dyn Fn() -> bool + Send + Sync>;

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    next_seq: u64,
    /// Sequence numbers of writes submitted and not yet finished (queued or
    /// running): what a flush waits for.
    writes: BTreeSet<u64>,
    running: usize,
    stop: bool,
}

struct Job {
    seq: u64,
    tag: u32,
    op: BlkOp,
}

impl State {
    fn runnable(&self, job: &Job) -> bool {
        match job.op {
            BlkOp::Flush => self.writes.first().is_none_or(|&w| w > job.seq),
            _ => true,
        }
    }

    fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.running == 0
    }
}

impl Shared {
    /// A panic on one worker must not wedge the others or `drain`, so a
    /// poisoned lock is used as is: the state is updated only in small
    /// steps that leave it consistent.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl DiskWorkers {
    /// Starts `threads` workers (at least one) for the disk in `slot`, each
    /// with its own [`FileBackend`] on `image`; each request takes at
    /// least `latency`.
    pub fn spawn(
        image: &DiskImage,
        slot: usize,
        threads: usize,
        latency: Duration,
        done: impl Fn(usize, IoCompletion) + Send + Sync + 'static,
    ) -> io::Result<DiskWorkers> {
        let backends = (0..threads.max(1)).map(|_| image.backend()).collect::<io::Result<Vec<_>>>()?;
        Self::spawn_with(slot, backends, latency, done)
    }

    /// Starts one worker per backend. The backends must all reach the same
    /// storage (clones of one file, say); any [`BlockBackend`] works, which
    /// also serves scratch disks and tests.
    pub fn spawn_with<B: BlockBackend + 'static>(
        slot: usize,
        backends: Vec<B>,
        latency: Duration,
        done: impl Fn(usize, IoCompletion) + Send + Sync + 'static,
    ) -> io::Result<DiskWorkers> {
        if backends.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a disk needs at least one worker"));
        }
        let shared = Arc::new(Shared {
            slot,
            latency,
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            idle: Condvar::new(),
            done: Box::new(done),
            permit: std::sync::OnceLock::new(),
        });
        // Built before the threads so that, if one fails to start, dropping
        // it stops those already running.
        let mut pool = DiskWorkers { shared, threads: Vec::new() };
        for (i, backend) in backends.into_iter().enumerate() {
            let shared = Arc::clone(&pool.shared);
            let handle =
                std::thread::Builder::new().name(format!("disk{slot}-{i}")).spawn(move || worker(shared, backend))?;
            pool.threads.push(handle);
        }
        Ok(pool)
    }

    /// From now on every write and flush waits for `permit` just before
    /// it reaches the disk, and fails (`VIRTIO_BLK_S_IOERR`) if it says
    /// never. Set once; reads are not outputs and never wait.
    pub fn fence_with(&self, permit: Permit) {
        let _ = self.shared.permit.set(permit);
    }

    /// Queues a request; returns at once. Its completion arrives through
    /// the callback, from a worker thread.
    pub fn submit(&self, tag: u32, op: BlkOp) {
        let mut st = self.shared.lock();
        let seq = st.next_seq;
        st.next_seq += 1;
        if matches!(op, BlkOp::Write { .. }) {
            st.writes.insert(seq);
        }
        st.queue.push_back(Job { seq, tag, op });
        drop(st);
        // All waiting workers are alike and each rescans the whole queue,
        // so one wake-up is enough.
        self.shared.work.notify_one();
    }

    /// Waits until every request submitted so far has finished and its
    /// completion callback has returned. Must not be called from the
    /// callback itself (it would wait for its own caller).
    pub fn drain(&self) {
        let mut st = self.shared.lock();
        while !st.is_idle() {
            st = self.shared.idle.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Requests queued or running.
    pub fn pending(&self) -> usize {
        let st = self.shared.lock();
        st.queue.len() + st.running
    }

    pub fn slot(&self) -> usize {
        self.shared.slot
    }
}

impl Drop for DiskWorkers {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.stop = true;
        // Discarded jobs will never run; forget them so the state reads as
        // idle to anyone still looking.
        st.queue.clear();
        drop(st);
        self.shared.work.notify_all();
        for t in self.threads.drain(..) {
            // A worker that panicked has nothing more to clean up.
            let _ = t.join();
        }
    }
}

/// Bookkeeping for a job a worker took: done on drop, so it also happens
/// if `execute` or the callback panics, and `drain` never waits forever.
struct Running<'a> {
    shared: &'a Shared,
    write_seq: Option<u64>,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.running -= 1;
        let mut unblocked = false;
        if let Some(seq) = self.write_seq {
            st.writes.remove(&seq);
            unblocked = true;
        }
        let idle = st.is_idle();
        drop(st);
        if unblocked {
            // A flush waiting for this write may be runnable now; any
            // worker may be the one to see it.
            self.shared.work.notify_all();
        }
        if idle {
            self.shared.idle.notify_all();
        }
    }
}

fn worker<B: BlockBackend>(shared: Arc<Shared>, mut backend: B) {
    let mut st = shared.lock();
    loop {
        if st.stop {
            return;
        }
        let Some(i) = st.queue.iter().position(|j| st.runnable(j)) else {
            st = shared.work.wait(st).unwrap_or_else(|e| e.into_inner());
            continue;
        };
        let Some(job) = st.queue.remove(i) else { continue };
        st.running += 1;
        drop(st);
        {
            let write_seq = matches!(job.op, BlkOp::Write { .. }).then_some(job.seq);
            let _running = Running { shared: &shared, write_seq };
            let started = Instant::now();
            let output = matches!(job.op, BlkOp::Write { .. } | BlkOp::Flush);
            let permitted = !output || shared.permit.get().is_none_or(|may| may());
            let result = if permitted {
                execute(&job.op, &mut backend)
            } else {
                ftvm_devices::virtio::blk::BlkResult {
                    status: ftvm_devices::virtio::blk::VIRTIO_BLK_S_IOERR,
                    data: Vec::new(),
                }
            };
            // A modelled slow disk: the request is done, but not yet.
            if let Some(rest) = shared.latency.checked_sub(started.elapsed()) {
                std::thread::sleep(rest);
            }
            (shared.done)(shared.slot, IoCompletion::Disk { tag: job.tag, result });
        }
        st = shared.lock();
    }
}
